// GemmScratch<T>: the packing buffers of the products, kept between calls so that repeated
// products allocate nothing: Eigen's GEMM blocking (the generic level's gemm calls Eigen's internal
// GEMM driver, general_matrix_matrix_product with gemm_blocking_space, whose interface is stable
// across the 3.4 series but not public: hence the version check) and the vector levels' per-call
// buffer for B's blocks.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>

#include "gpt2/kernels/int8.hpp"
#include "gpt2/kernels/layout.hpp"
#include "gpt2/types.hpp"

static_assert(EIGEN_VERSION_AT_LEAST(3, 4, 0) && !EIGEN_VERSION_AT_LEAST(3, 4, 90),
              "gpt2/kernels/gemm_scratch.hpp uses Eigen 3.4's internal GEMM driver: check it before "
              "using another Eigen version");

namespace gpt2 {

// Packing buffers for products with at most max_m rows, max_n columns and depth max_k.
// Not thread-safe: one GemmScratch per thread.
template <class T>
class GemmScratch {
 public:
  using Blocking = Eigen::internal::gemm_blocking_space<Eigen::RowMajor, T, T, Eigen::Dynamic,
                                                        Eigen::Dynamic, Eigen::Dynamic, 1, false>;

  // Empty: grows on the first product. The second form allocates (and owns) packing buffers for
  // products up to [max_m, max_k] x [max_k, max_n] up front.
  GemmScratch() = default;
  GemmScratch(Index max_m, Index max_n, Index max_k) { reserve(max_m, max_n, max_k); }

  // Grows the buffers to fit an [max_m, max_k] x [max_k, max_n] product (allocates only when
  // they grow; a smaller request keeps the current buffers). If an allocation throws, the scratch
  // keeps its current buffers and stays usable (the vector levels' buffer, allocated first, may
  // have been added).
  void reserve(Index max_m, Index max_n, Index max_k) {
    reserve_packed_b();
    if (fits(max_m, max_n, max_k)) return;
    const Index m = std::max(max_m, max_m_), n = std::max(max_n, max_n_), k = std::max(max_k, max_k_);
    auto blocking = std::make_unique<Blocking>(m, n, k, 1, true);
    blocking->allocateAll();
    blocking_ = std::move(blocking);
    max_m_ = m;
    max_n_ = n;
    max_k_ = k;
  }

  // Whether an [m, k] x [k, n] product runs without growing the buffers.
  bool fits(Index m, Index n, Index k) const {
    return blocking_ != nullptr && m <= max_m_ && n <= max_n_ && k <= max_k_;
  }

  // Eigen's blocking object over the buffers (owned by this scratch; valid until it grows).
  // Precondition: the scratch has been reserved (fits() for some size).
  Blocking& blocking() { return *blocking_; }

  // Grows the buffer of int8 products' quantized rows (kernels/int8.hpp) to fit products with
  // rows rows (at most kInt8ChunkRows count) of depth K; allocates only when it grows.
  void reserve_int8(Index rows, Index K) {
    const Index need = std::min(std::max<Index>(rows, 1), kernels::kInt8ChunkRows) *
                       kernels::int8_row_bytes(K);
    if (need <= int8_bytes_) return;
    int8_.reset(static_cast<std::uint8_t*>(
        ::operator new(static_cast<std::size_t>(need), std::align_val_t(64))));
    int8_bytes_ = need;
  }
  // That buffer (null until reserve_int8).
  std::uint8_t* int8_rows() { return int8_.get(); }

  // Bytes of the packing buffers held.
  Index bytes() const {
    const Index packed = (packed_b_ ? kernels::kPackFloats * static_cast<Index>(sizeof(T)) : 0) +
                         int8_bytes_;
    if (!blocking_) return packed;
    Blocking& b = *blocking_;
    return packed + (b.mc() * b.kc() + b.kc() * b.nc()) * static_cast<Index>(sizeof(T));
  }

  // The vector levels' buffer for B's blocks (kernels::kPackFloats floats, 64-byte aligned),
  // allocated by reserve() or here on first use. Empty for double.
  T* packed_b() {
    reserve_packed_b();
    return packed_b_.get();
  }

 private:
  void reserve_packed_b() {
    if constexpr (std::is_same<T, float>::value) {
      if (!packed_b_)
        packed_b_.reset(static_cast<T*>(::operator new(
            static_cast<std::size_t>(kernels::kPackFloats) * sizeof(T), std::align_val_t(64))));
    }
  }

  struct AlignedDelete {
    void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
    void operator()(std::uint8_t* p) const { ::operator delete(p, std::align_val_t(64)); }
  };
  std::unique_ptr<std::uint8_t, AlignedDelete> int8_;  // reserve_int8
  Index int8_bytes_ = 0;
  std::unique_ptr<Blocking> blocking_;
  std::unique_ptr<T, AlignedDelete> packed_b_;  // 64-byte aligned (the vector levels' stores)
  Index max_m_ = 0, max_n_ = 0, max_k_ = 0;
};

enum class Op { None, Transpose };

}  // namespace gpt2
