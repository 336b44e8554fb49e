// Loading the PyTorch reference fixtures (tests/reference/fixtures/*.safetensors, made by
// tests/reference/generate.py) and rebuilding each case's inputs: from the deterministic generator
// (det_random.hpp) for the synthetic cases, from the real GPT-2 checkpoint (GPT2_SMALL_WEIGHTS)
// for the gpt2_layer0_* cases.
#pragma once

#include <cstdlib>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gpt2/layer_norm.hpp"
#include "gpt2/safetensors.hpp"
#include "gpt2/weights.hpp"
#include "support/det_random.hpp"

namespace gpt2::test {

// The path of the real GPT-2 small layer-0 weights, or empty when GPT2_SMALL_WEIGHTS is unset.
inline std::string real_weights_path() {
  const char* p = std::getenv("GPT2_SMALL_WEIGHTS");
  return p ? std::string(p) : std::string();
}

// One reference case: its metadata and reference tensors (float64, computed by PyTorch).
class Fixture {
 public:
  explicit Fixture(const std::string& name)
      : name_(name),
        file_(safetensors::File::open(std::string(GPT2_FIXTURE_DIR) + "/" + name + ".safetensors")) {
    C_ = integer("n_embd");
    n_head_ = integer("n_head");
    T_ = integer("T");
    std::stringstream rows(meta("rows"));
    for (std::string r; std::getline(rows, r, ',');) rows_.push_back(std::stoll(r));
  }

  const std::string& name() const { return name_; }
  Index n_embd() const { return C_; }
  Index n_head() const { return n_head_; }
  Index head_dim() const { return C_ / n_head_; }
  Index tokens() const { return T_; }
  const std::vector<Index>& rows() const { return rows_; }  // the query rows stored
  bool is_real() const { return file_.metadata().count("seed") == 0; }
  bool has(const std::string& tensor) const { return file_.contains(tensor); }
  bool has_meta(const std::string& key) const { return file_.metadata().count(key) != 0; }

  const std::string& meta(const std::string& key) const {
    const auto it = file_.metadata().find(key);
    if (it == file_.metadata().end()) throw std::runtime_error(name_ + ": no metadata " + key);
    return it->second;
  }
  double number(const std::string& key) const { return std::stod(meta(key)); }
  Index integer(const std::string& key) const { return std::stoll(meta(key)); }

  // A 2-D reference tensor [R, width].
  RowMatrix<double> matrix(const std::string& tensor) const { return file_.matrix<double>(tensor); }
  // A 2-D tensor stored as F32 (out_bf16_weights), widened to double.
  RowMatrix<double> matrix_f32(const std::string& tensor) const {
    return file_.matrix<float>(tensor).cast<double>();
  }

  // Head h of a 3-D reference tensor [n_head, R, width] -> [R, width].
  RowMatrix<double> head(const std::string& tensor, Index h) const {
    const safetensors::TensorInfo& info = file_.tensor(tensor);
    const Index R = info.shape[1], width = info.shape[2];
    const double* data = reinterpret_cast<const double*>(info.data);
    return ConstMatrixMap<double>(data + h * R * width, R, width);
  }

 private:
  std::string name_;
  safetensors::File file_;
  Index C_ = 0, n_head_ = 0, T_ = 0;
  std::vector<Index> rows_;
};

// The inputs of a case in scalar type T: x [T, C] and the four weight tensors.
template <class T>
class CaseInputs {
 public:
  // Synthetic case: everything from the deterministic generator.
  static std::unique_ptr<CaseInputs> synthetic(const Fixture& f) {
    auto in = std::unique_ptr<CaseInputs>(new CaseInputs);
    const auto seed = static_cast<std::uint64_t>(f.integer("seed"));
    const Index C = f.n_embd();
    in->x = det_matrix<T>(seed + kSeedOffsetX, f.tokens(), C, f.number("scale_x"));
    in->c_attn_w = det_matrix<T>(seed + kSeedOffsetCAttnWeight, C, 3 * C, f.number("scale_c_attn_weight"));
    in->c_attn_b = det_vector<T>(seed + kSeedOffsetCAttnBias, 3 * C, f.number("scale_c_attn_bias"));
    in->c_proj_w = det_matrix<T>(seed + kSeedOffsetCProjWeight, C, C, f.number("scale_c_proj_weight"));
    in->c_proj_b = det_vector<T>(seed + kSeedOffsetCProjBias, C, f.number("scale_c_proj_bias"));
    in->weights_.emplace(AttentionConfig{C, f.n_head()}, view(in->c_attn_w), view(in->c_attn_b),
                         view(in->c_proj_w), view(in->c_proj_b));
    return in;
  }

  // Real case: layer-0 weights from the checkpoint (zero-copy for float), x = ln_1(wpe[:T])
  // computed in double and rounded once to T.
  static std::unique_ptr<CaseInputs> real(const Fixture& f, const std::string& path) {
    auto in = std::unique_ptr<CaseInputs>(new CaseInputs);
    in->file_.emplace(safetensors::File::open(path));
    const safetensors::File& file = *in->file_;
    in->loaded_.emplace(safetensors::load_attention<T>(file, 0, f.n_head()));
    in->weights_.emplace(in->loaded_->weights());
    const Index C = f.n_embd(), T_ = f.tokens();
    const std::vector<double> wpe = file.to_vector<double>("wpe.weight");
    const std::vector<double> ln_w = file.to_vector<double>("h.0.ln_1.weight");
    const std::vector<double> ln_b = file.to_vector<double>("h.0.ln_1.bias");
    RowMatrix<double> x64(T_, C);
    layer_norm<double>(ConstMatrixMap<double>(wpe.data(), T_, C), ConstVectorMap<double>(ln_w.data(), C),
                       ConstVectorMap<double>(ln_b.data(), C), 1e-5, x64);
    in->x = x64.cast<T>();
    return in;
  }

  const AttentionWeights<T>& weights() const { return *weights_; }
  RowMatrix<T> x;

 private:
  CaseInputs() = default;
  RowMatrix<T> c_attn_w, c_proj_w;
  RowVector<T> c_attn_b, c_proj_b;
  std::optional<safetensors::File> file_;
  std::optional<safetensors::LoadedAttention<T>> loaded_;
  std::optional<AttentionWeights<T>> weights_;
};

}  // namespace gpt2::test
