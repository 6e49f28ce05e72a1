// A growable scratch buffer whose data starts on a cache line (64 bytes).
//
// Why: the many-rows passes dequantise (or widen) a group of panels into a per-thread scratch
// and then load it a full vector (64 bytes) at a time, once per row pass. std::vector's storage
// is only 16-byte aligned (malloc), so three of every four of those loads straddled two cache
// lines: the float32 block passes ran at 0.84x the dense kernel on the same tile (one thread,
// 64 rows), and at 0.99-1.00x once the scratch was aligned (PERFORMANCE.md, #31 item 1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tgserve {

template <typename T>
class AlignedScratch {
 public:
  static constexpr std::size_t kAlign = 64;

  // At least n elements starting on a 64-byte boundary; the contents are not kept when the
  // buffer grows (every caller refills it after asking).
  T* resize(std::size_t n) {
    storage_.resize(n + kAlign / sizeof(T) + 1);
    const auto address = reinterpret_cast<std::uintptr_t>(storage_.data());
    data_ = reinterpret_cast<T*>((address + kAlign - 1) & ~std::uintptr_t(kAlign - 1));
    return data_;
  }
  T* data() const { return data_; }

 private:
  std::vector<T> storage_;
  T* data_ = nullptr;
};

}  // namespace tgserve
