// kiln/object_pool.h: per-thread free lists for the small objects every op allocates.
//
//   class TensorImpl : public RefCounted, public PooledObject<TensorImpl> { ... };
//   auto* t = new TensorImpl(...);   // from this thread's free list when it has one
//
// Note [Pooled objects]: each op creates a TensorImpl and a Storage. glibc's malloc/free pair
// costs ~20 ns; a thread-local free list costs a few. Objects may be freed on another thread:
// they then join that thread's list. Each list is bounded, and a thread's list is released when
// the thread exits (later frees on that thread go straight to the global heap).
#pragma once

#include <cstddef>
#include <new>

namespace kiln {

namespace detail {
template <size_t Size>
struct FreeList {
  static constexpr int kMax = 4096;
  void* items[kMax];
  int n = 0;
  ~FreeList() {
    while (n > 0) ::operator delete(items[--n]);
    dead() = true;
  }
  static bool& dead() {
    static thread_local bool d = false;
    return d;
  }
  static FreeList* get() {
    if (dead()) return nullptr;
    static thread_local FreeList list;
    return &list;
  }
};
}  // namespace detail

template <typename T>
struct PooledObject {
  static void* operator new(size_t size) {
    if (size == sizeof(T)) {
      if (auto* fl = detail::FreeList<sizeof(T)>::get(); fl && fl->n > 0) return fl->items[--fl->n];
    }
    return ::operator new(size);
  }
  static void operator delete(void* p, size_t size) {
    if (size == sizeof(T)) {
      if (auto* fl = detail::FreeList<sizeof(T)>::get(); fl && fl->n < fl->kMax) {
        fl->items[fl->n++] = p;
        return;
      }
    }
    ::operator delete(p);
  }
};

}  // namespace kiln
