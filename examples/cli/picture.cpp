// The pictures of --png: drawn (attention_picture.hpp) and encoded with stb_image_write
// (png_image.hpp), for float and double probabilities.
#include "cli_kernels.hpp"  // first: the kernels are compiled once, in kernels.cpp

#include "picture.hpp"

#include "attention_picture.hpp"
#include "png_image.hpp"

namespace gpt2::cli {

template <class T>
std::vector<unsigned char> attention_png(const ConstMatrixRef<T>& probs, Index n_head, Index T_,
                                         const std::vector<Span>& spans, bool batched,
                                         ColourScale scale, const std::string& title) {
  return encode_png(attention_picture<T>(probs, n_head, T_, spans, batched, scale, title));
}

template std::vector<unsigned char> attention_png<float>(const ConstMatrixRef<float>&, Index, Index,
                                                         const std::vector<Span>&, bool, ColourScale,
                                                         const std::string&);
template std::vector<unsigned char> attention_png<double>(const ConstMatrixRef<double>&, Index, Index,
                                                          const std::vector<Span>&, bool, ColourScale,
                                                          const std::string&);

}  // namespace gpt2::cli
