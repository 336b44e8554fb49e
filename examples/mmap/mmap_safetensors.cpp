// gpt2_mmap_safetensors: one layer's weights used where they lie in a memory-mapped .safetensors
// file (zero copy), then a forward.   gpt2_mmap_safetensors [FILE.safetensors]
//
// FILE, else $GPT2_SMALL_WEIGHTS, else a small file this program writes itself to a temporary
// directory (C = 64, 4 heads), so it runs with and without a checkpoint. Exit status 1 if a weight
// was copied or the forward is wrong.
#include <gpt2/attention.hpp>
#include <gpt2/safetensors.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>  // getpid

using gpt2::RowMatrix;

// A safetensors file: 8-byte header length N, N bytes of JSON, then the F32 data (C order).
std::string write_small_checkpoint(const std::filesystem::path& path) {
  std::string header = "{", data;
  const auto add = [&](const std::string& name, gpt2::Index rows, gpt2::Index cols, float scale) {
    const RowMatrix<float> m = RowMatrix<float>::Random(rows, cols) * scale;  // rows 1: a vector
    const std::size_t begin = data.size();
    data.append(reinterpret_cast<const char*>(m.data()), sizeof(float) * m.size());
    const std::string shape = (rows > 1 ? std::to_string(rows) + "," : "") + std::to_string(cols);
    header += (header.size() > 1 ? ",\"" : "\"") + name + "\":{\"dtype\":\"F32\",\"shape\":[" +
              shape + "],\"data_offsets\":[" + std::to_string(begin) + "," +
              std::to_string(data.size()) + "]}";
  };
  add("h.0.attn.c_attn.weight", 64, 192, 0.3f);  // C = 64: [C, 3C], [3C], [C, C], [C]
  add("h.0.attn.c_attn.bias", 1, 192, 0.1f);
  add("h.0.attn.c_proj.weight", 64, 64, 0.3f);
  add("h.0.attn.c_proj.bias", 1, 64, 0.1f);
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned
  const unsigned long long n = header.size();       // little-endian u64 (x86, ARM)
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(&n), 8)
      << header << data;
  return path.string();
}

int main(int argc, char** argv) try {
  const char* env = std::getenv("GPT2_SMALL_WEIGHTS");
  const std::filesystem::path tmp =
      std::filesystem::temp_directory_path() / ("gpt2_mmap_example-" + std::to_string(::getpid()));
  std::string path = argc > 1 ? argv[1] : (env && *env ? env : "");
  const bool own = path.empty();
  if (own) {
    std::filesystem::create_directories(tmp);
    path = write_small_checkpoint(tmp / "small.safetensors");
  }

  // Mapped read-only and validated; `file` must outlive every view into it.
  const gpt2::safetensors::File file = gpt2::safetensors::File::open(path);
  // Layer 0's c_attn.weight [C, 3C], c_attn.bias [3C], c_proj.weight [C, C], c_proj.bias [C]:
  // F32 tensors become views into the mapping; anything else would be converted (zero_copy false).
  // n_head 0: C / 64, as in every GPT-2 size; our small file has 4 heads of 16.
  const auto layer0 = gpt2::safetensors::load_attention<float>(file, /*layer=*/0, own ? 4 : 0);
  const gpt2::AttentionWeights<float>& w = layer0.weights();
  const auto in_file = [&](const float* p) {
    const auto* b = reinterpret_cast<const unsigned char*>(p);
    return b >= file.bytes() && b < file.bytes() + file.size();
  };
  const bool zero_copy = layer0.zero_copy() && in_file(w.c_attn_weight().data()) &&
                         in_file(w.c_proj_weight().data());

  // x [T, C] -> y [T, C]; the same weights copied into plain matrices give the same y.
  const RowMatrix<float> x = RowMatrix<float>::Random(16, w.n_embd());
  const RowMatrix<float> y = gpt2::attention(w, x);
  const RowMatrix<float> cw = w.c_attn_weight(), pw = w.c_proj_weight();  // explicit copies
  const gpt2::RowVector<float> cb = w.c_attn_bias(), pb = w.c_proj_bias();
  const gpt2::AttentionWeights<float> copied(w.config(), gpt2::view(cw), gpt2::view(cb),
                                             gpt2::view(pw), gpt2::view(pb));
  const float diff = (gpt2::attention(copied, x) - y).cwiseAbs().maxCoeff();
  std::printf("%s: C = %td, %td heads, %zu bytes mapped; zero copy: %s; max |y - y_copied| = %g\n",
              path.c_str(), w.n_embd(), w.n_head(), file.size(), zero_copy ? "yes" : "NO",
              static_cast<double>(diff));
  std::filesystem::remove_all(tmp);  // the mapping stays valid until `file` is destroyed
  return zero_copy && y.allFinite() && diff <= 1e-6f * y.cwiseAbs().maxCoeff() ? 0 : 1;
} catch (const std::exception& e) {  // gpt2::Error: a missing or malformed file, bad shapes
  std::fprintf(stderr, "gpt2_mmap_safetensors: %s\n", e.what());
  return 1;
}
