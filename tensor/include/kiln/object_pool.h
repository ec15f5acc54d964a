// kiln/object_pool.h: per-thread free lists for the small objects every op allocates.
//
//   class TensorImpl : public RefCounted, public PooledObject<TensorImpl> { ... };
//   auto* t = new TensorImpl(...);   // from this thread's free list when it has one
//
// Note [Pooled objects]: each op creates a TensorImpl and a Storage. glibc's malloc/free pair
// costs ~20 ns when its per-thread cache hits, and far more once many objects are alive (a
// Python list of 200k results: bin searches, coalescing and heap trimming on every round). A
// thread-local free list costs a few ns whatever the number alive. The list is linked through
// the free blocks themselves and bounded (kMaxPooled blocks per size and thread: 14 MiB of
// TensorImpls at most), and reading it is one thread-local access (a trivially destructible
// variable, so no guard). Objects may be freed on another thread: they then join that thread's
// list. A thread's lists are released when it exits; later frees on it go to the global heap.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace kiln {

namespace detail {
constexpr uint32_t kMaxPooled = uint32_t{1} << 16;

struct FreeList {
  void* head = nullptr;  // each free block's first word points to the next one
  uint32_t n = 0;
  bool owned = false;  // an owner will release the list at thread exit
  bool dead = false;   // released: frees bypass the list from now on
};

template <size_t Size>
constinit thread_local FreeList t_free_list;

template <size_t Size>
struct FreeListOwner {
  ~FreeListOwner() {
    FreeList& fl = t_free_list<Size>;
    while (fl.head) {
      void* p = fl.head;
      fl.head = *static_cast<void**>(p);
      ::operator delete(p);
    }
    fl.n = 0;
    fl.dead = true;
  }
};

template <size_t Size>
[[gnu::noinline]] void own_free_list() {
  static thread_local FreeListOwner<Size> owner;
  (void)owner;
  t_free_list<Size>.owned = true;
}
}  // namespace detail

template <typename T>
struct PooledObject {
  static void* operator new(size_t size) {
    detail::FreeList& fl = detail::t_free_list<sizeof(T)>;
    if (size != sizeof(T) || !fl.head) return ::operator new(size);
    void* p = fl.head;
    fl.head = *static_cast<void**>(p);
    --fl.n;
    return p;
  }
  static void operator delete(void* p, size_t size) {
    detail::FreeList& fl = detail::t_free_list<sizeof(T)>;
    if (size != sizeof(T) || fl.dead || fl.n >= detail::kMaxPooled) return ::operator delete(p);
    if (!fl.owned) detail::own_free_list<sizeof(T)>();
    *static_cast<void**>(p) = fl.head;
    fl.head = p;
    ++fl.n;
  }
};

}  // namespace kiln
