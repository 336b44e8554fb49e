// Opening a checkpoint and loading a layer (checkpoint.hpp).
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "checkpoint.hpp"

#include "args.hpp"

namespace gpt2::cli {

safetensors::File open_weights(const std::string& path) {
  try {
    return safetensors::File::open(path);
  } catch (const Error& e) {
    throw Error(in_context("weights", path, e.what()));
  }
}

template <class T>
safetensors::LoadedAttention<T> load_layer(const safetensors::File& file, int layer, Index n_head) {
  try {
    return safetensors::load_attention<T>(file, layer, n_head);
  } catch (const Error& e) {
    throw Error(in_context("weights", file.label(), e.what()));
  }
}

template safetensors::LoadedAttention<float> load_layer<float>(const safetensors::File&, int, Index);
template safetensors::LoadedAttention<double> load_layer<double>(const safetensors::File&, int,
                                                                 Index);

}  // namespace gpt2::cli
