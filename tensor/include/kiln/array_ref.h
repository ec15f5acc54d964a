// kiln/array_ref.h: non-owning views of arrays (IntArrayRef) and a small inline vector (DimVector).
//
//   void f(kiln::IntArrayRef dims);     f({0, 2});   f(std::vector<int64_t>{1});   f(t.sizes());
//   kiln::DimVector v{2, 3};  v.push_back(4);      // inline up to 6 elements, no heap
//   kiln::OptionalIntArrayRef d = std::nullopt;     // "dim=None"
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <vector>

namespace kiln {

template <typename T>
class ArrayRef {
 public:
  constexpr ArrayRef() = default;
  constexpr ArrayRef(const T* data, size_t n) : data_(data), size_(n) {}
  constexpr ArrayRef(const T& one) : data_(&one), size_(1) {}  // NOLINT: implicit by design
  // Valid for the full-expression that creates the list (a call's arguments), as in PyTorch.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"
  constexpr ArrayRef(std::initializer_list<T> il) : data_(il.begin()), size_(il.size()) {}
#pragma GCC diagnostic pop
  template <typename A>
  ArrayRef(const std::vector<T, A>& v) : data_(v.data()), size_(v.size()) {}  // NOLINT
  constexpr const T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr bool empty() const { return size_ == 0; }
  constexpr const T& operator[](size_t i) const { return data_[i]; }
  constexpr const T* begin() const { return data_; }
  constexpr const T* end() const { return data_ + size_; }
  const T& back() const { return data_[size_ - 1]; }
  std::vector<T> vec() const { return std::vector<T>(begin(), end()); }
  bool equals(ArrayRef o) const { return size_ == o.size_ && std::equal(begin(), end(), o.begin()); }
  friend bool operator==(ArrayRef a, ArrayRef b) { return a.equals(b); }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

using IntArrayRef = ArrayRef<int64_t>;

std::ostream& operator<<(std::ostream& os, IntArrayRef a);

// An optional list of ints that accepts braces: f({0, 1}), f(std::nullopt), f(vec).
class OptionalIntArrayRef {
 public:
  OptionalIntArrayRef() = default;
  OptionalIntArrayRef(std::nullopt_t) {}  // NOLINT
  OptionalIntArrayRef(std::initializer_list<int64_t> il) : ref_(il), has_(true) {}
  OptionalIntArrayRef(IntArrayRef r) : ref_(r), has_(true) {}  // NOLINT
  OptionalIntArrayRef(const std::vector<int64_t>& v) : ref_(v), has_(true) {}  // NOLINT
  OptionalIntArrayRef(const std::optional<std::vector<int64_t>>& v) {  // NOLINT
    if (v) ref_ = *v, has_ = true;
  }
  bool has_value() const { return has_; }
  explicit operator bool() const { return has_; }
  IntArrayRef operator*() const { return ref_; }
  const IntArrayRef* operator->() const { return &ref_; }
  IntArrayRef value() const { return ref_; }

 private:
  IntArrayRef ref_;
  bool has_ = false;
};

// A vector of int64 with 6 elements inline: sizes and strides never touch the heap for dim <= 6.
class DimVector {
 public:
  static constexpr size_t kInline = 6;
  DimVector() = default;
  explicit DimVector(size_t n, int64_t v = 0) { resize(n, v); }
  DimVector(std::initializer_list<int64_t> il) { assign(il.begin(), il.size()); }
  DimVector(IntArrayRef r) { assign(r.data(), r.size()); }  // NOLINT
  DimVector(const DimVector& o) { assign(o.data(), o.size()); }
  DimVector(DimVector&& o) noexcept { move_from(o); }
  DimVector& operator=(const DimVector& o) {
    if (this != &o) assign(o.data(), o.size());
    return *this;
  }
  DimVector& operator=(DimVector&& o) noexcept {
    if (this != &o) {
      release();
      move_from(o);
    }
    return *this;
  }
  ~DimVector() { release(); }

  operator IntArrayRef() const { return IntArrayRef(data(), size_); }  // NOLINT
  IntArrayRef ref() const { return *this; }
  int64_t* data() { return heap_ ? heap_ : inline_; }
  const int64_t* data() const { return heap_ ? heap_ : inline_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t& operator[](size_t i) { return data()[i]; }
  int64_t operator[](size_t i) const { return data()[i]; }
  int64_t* begin() { return data(); }
  int64_t* end() { return data() + size_; }
  const int64_t* begin() const { return data(); }
  const int64_t* end() const { return data() + size_; }
  int64_t& back() { return data()[size_ - 1]; }
  void push_back(int64_t v) {
    reserve(size_ + 1);
    data()[size_++] = v;
  }
  void insert(size_t pos, int64_t v) {
    reserve(size_ + 1);
    int64_t* d = data();
    std::memmove(d + pos + 1, d + pos, (size_ - pos) * sizeof(int64_t));
    d[pos] = v;
    ++size_;
  }
  void erase(size_t pos) {
    int64_t* d = data();
    std::memmove(d + pos, d + pos + 1, (size_ - pos - 1) * sizeof(int64_t));
    --size_;
  }
  void resize(size_t n, int64_t v = 0) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data()[i] = v;
    size_ = n;
  }
  void reserve(size_t n) {
    if (n <= capacity()) return;
    size_t cap = std::max(n, capacity() * 2);
    auto* h = new int64_t[cap];
    std::memcpy(h, data(), size_ * sizeof(int64_t));
    release();
    heap_ = h;
    cap_ = cap;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  friend bool operator==(const DimVector& a, const DimVector& b) { return a.ref() == b.ref(); }

 private:
  size_t capacity() const { return heap_ ? cap_ : kInline; }
  void assign(const int64_t* p, size_t n) {
    size_ = 0;
    reserve(n);
    std::memcpy(data(), p, n * sizeof(int64_t));
    size_ = n;
  }
  void release() {
    delete[] heap_;
    heap_ = nullptr;
  }
  void move_from(DimVector& o) {
    size_ = o.size_;
    if (o.heap_) {
      heap_ = o.heap_;
      cap_ = o.cap_;
      o.heap_ = nullptr;
    } else {
      std::memcpy(inline_, o.inline_, size_ * sizeof(int64_t));
    }
    o.size_ = 0;
  }
  int64_t inline_[kInline];
  int64_t* heap_ = nullptr;
  size_t size_ = 0;
  size_t cap_ = 0;
};

}  // namespace kiln
