// A whole forward step of a Llama-family model in C++ (see decoder.cpp).
#pragma once

#include <torch/extension.h>

namespace tgserve {

void bind_decoder(pybind11::module& m);

}  // namespace tgserve
