// The int8 / int16 activation linears' Python bindings (q8_bindings.cpp), apart from q8_linear.h
// so the kernels themselves need no torch or Python headers (models/cpu_kernels/checks build them
// alone, for other targets too).
#pragma once

#include <torch/extension.h>

namespace tgserve {

// q8_quantize, q8_linear and q8_isa (the integer path of this build) on the extension module.
void bind_q8_linear(pybind11::module& m);

}  // namespace tgserve
