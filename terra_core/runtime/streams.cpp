#include "streams.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace terra::runtime {

std::optional<c10::Stream> current_stream(c10::Device device) {
  if (device.is_cpu() || device.is_meta()) return std::nullopt;
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  return impl->getStream(device.has_index() ? device : impl->getDevice());
}

void StreamSwitcher::use(const std::optional<c10::Stream>& stream) {
  if (!stream || stream == current_) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(stream->device_type());
  impl->setDevice(stream->device());
  impl->exchangeStream(*stream);
  current_ = stream;
}

}  // namespace terra::runtime
