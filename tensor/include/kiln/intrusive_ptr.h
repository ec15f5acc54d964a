// kiln/intrusive_ptr.h: a reference-counted pointer whose count lives in the object.
//
//   struct Node : kiln::RefCounted { int v = 0; };
//   kiln::intrusive_ptr<Node> p = kiln::make_intrusive<Node>();
//   auto q = p;            // one atomic increment, no control block
//
// Tensors use it instead of std::shared_ptr: one allocation per object, and the count sits on
// the same cache line as the data the dispatcher reads next.
#pragma once

#include <atomic>
#include <utility>

namespace kiln {

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;
  virtual ~RefCounted() = default;
  void incref() const { refcount_.fetch_add(1, std::memory_order_relaxed); }
  void decref() const {
    if (refcount_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  int use_count() const { return refcount_.load(std::memory_order_relaxed); }

 private:
  mutable std::atomic<int> refcount_{0};
};

template <typename T>
class intrusive_ptr {
 public:
  intrusive_ptr() = default;
  intrusive_ptr(std::nullptr_t) {}  // NOLINT
  explicit intrusive_ptr(T* p) : p_(p) {
    if (p_) p_->incref();
  }
  intrusive_ptr(const intrusive_ptr& o) : p_(o.p_) {
    if (p_) p_->incref();
  }
  intrusive_ptr(intrusive_ptr&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  template <typename U>
  intrusive_ptr(const intrusive_ptr<U>& o) : p_(o.get()) {  // NOLINT
    if (p_) p_->incref();
  }
  ~intrusive_ptr() {
    if (p_) p_->decref();
  }
  intrusive_ptr& operator=(intrusive_ptr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  T* get() const { return p_; }
  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() { intrusive_ptr().swap(*this); }
  void swap(intrusive_ptr& o) noexcept { std::swap(p_, o.p_); }
  int use_count() const { return p_ ? p_->use_count() : 0; }
  friend bool operator==(const intrusive_ptr& a, const intrusive_ptr& b) { return a.p_ == b.p_; }

 private:
  T* p_ = nullptr;
};

template <typename T, typename... Args>
intrusive_ptr<T> make_intrusive(Args&&... args) {
  return intrusive_ptr<T>(new T(std::forward<Args>(args)...));
}

}  // namespace kiln
