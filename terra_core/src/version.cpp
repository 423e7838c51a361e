#include "terra/version.h"

namespace terra {
const char* version() { return TERRA_VERSION; }
}  // namespace terra
