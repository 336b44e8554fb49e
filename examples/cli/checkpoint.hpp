// Reading a layer from a checkpoint, for run and demo: the file opened, the layer's attention
// weights loaded, errors put in context ("weights W.safetensors: <problem>"). Compiled in
// checkpoint.cpp alone (the JSON header parser with it).
#pragma once

#include <string>

#include "gpt2/safetensors.hpp"

namespace gpt2::cli {

// Opens the checkpoint; errors read "weights W.safetensors: <problem>".
safetensors::File open_weights(const std::string& path);

// Layer `layer`'s attention weights as T (converted when the file stores another dtype); errors
// read "weights W.safetensors: <problem>". T: float or double.
template <class T>
safetensors::LoadedAttention<T> load_layer(const safetensors::File& file, int layer, Index n_head);

}  // namespace gpt2::cli
