// Terra's version, as one string shared by the kernel's kernel_info and the Python module.
#pragma once

namespace terra {
const char* version();
}  // namespace terra
