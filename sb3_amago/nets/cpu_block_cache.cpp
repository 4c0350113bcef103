// A cache of freed CPU blocks in front of torch's CPU allocator (sb3_amago/cpu_memory.py, "CPU memory" in
// docs/design.md).
//
// An update allocates and frees the same sizes in the same order every time. A freed block of at least
// MIN_BYTES goes on a free list of its exact size instead of back to the C library, and the next request
// of that size takes the last block freed there (likely still in the caches). Blocks are torch's own
// (c10::alloc_cpu, 64-byte aligned) and each one's data pointer is its context, as torch's default
// allocator makes them, so raw_allocate / raw_deleter work (oneDNN takes its scratch space through them);
// the sizes of the blocks handed out are kept in a table beside them. A block the table does not know
// (made before the cache was installed, or a small one) goes to torch's own deleter.
//
// When the free lists would hold more than the cap, they are emptied back to the C library first, so
// sizes that are no longer asked for do not fill the cap for good. Memory the profiler sees
// (torch.profiler's profile_memory) is reported as the default allocator reports it: a block counts
// from when it is handed out until it is freed, not while it waits on a list.

#include <torch/extension.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <pthread.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace block_cache {

constexpr size_t MIN_BYTES = 4096;  // smaller blocks: the C library's own small-block caches serve them well

struct Cache final : c10::Allocator {
  c10::Allocator* fallback = nullptr;  // torch's default CPU allocator: small blocks
  std::mutex mutex;
  std::unordered_map<size_t, std::vector<void*>> free_lists;  // exact size -> blocks, last freed last
  std::unordered_map<void*, size_t> handed_out;                // block -> its size
  size_t held = 0, cap = 0;                                    // bytes on the free lists, and their bound
  int64_t hits = 0, misses = 0;

  c10::DataPtr allocate(size_t n) override {
    if (n < MIN_BYTES) return fallback->allocate(n);
    void* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto list = free_lists.find(n);
      if (list != free_lists.end() && !list->second.empty()) {
        block = list->second.back();
        list->second.pop_back();
        held -= n;
        ++hits;
      } else {
        ++misses;
      }
    }
    if (block == nullptr) {
      try {
        block = c10::alloc_cpu(n);
      } catch (const c10::Error&) {  // out of memory: hand the held blocks back and try once more
        release();
        block = c10::alloc_cpu(n);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      handed_out.insert_or_assign(block, n);  // an entry left by a block freed behind the cache's back is stale
    }
    c10::profiledCPUMemoryReporter().New(block, n);
    return {block, block, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &give_back; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  // Frees every block on the free lists.
  void release() {
    std::lock_guard<std::mutex> lock(mutex);
    release_locked();
  }

  void release_locked() {
    for (auto& entry : free_lists)
      for (void* block : entry.second) c10::free_cpu(block);
    free_lists.clear();
    held = 0;
  }

  static void give_back(void* block);
};

// Never destroyed: tensors freed while the process exits still find it.
Cache* const cache = new Cache();

void Cache::give_back(void* block) {
  if (block == nullptr) return;
  c10::profiledCPUMemoryReporter().Delete(block);
  {
    std::lock_guard<std::mutex> lock(cache->mutex);
    auto entry = cache->handed_out.find(block);
    if (entry != cache->handed_out.end()) {
      const size_t n = entry->second;
      cache->handed_out.erase(entry);
      if (n <= cache->cap) {
        if (cache->held + n > cache->cap) cache->release_locked();
        cache->free_lists[n].push_back(block);
        cache->held += n;
        return;
      }
    }
  }
  c10::free_cpu(block);
}

// A fork while another thread holds the lock would leave it held in the child for good.
void lock_for_fork() { cache->mutex.lock(); }
void unlock_after_fork() { cache->mutex.unlock(); }

}  // namespace block_cache

// Puts the cache in front of torch's default CPU allocator with a cap in bytes; whether it is in use.
// Installed once per process (later calls set the cap); not installed where another allocator has
// already replaced torch's default one (a library's, or the user's), which is then left in place.
bool cache_freed_blocks(int64_t cap_bytes) {
  using block_cache::cache;
  TORCH_CHECK(cap_bytes >= 0, "the cache's cap must be at least 0 bytes, got ", cap_bytes);
  {
    std::lock_guard<std::mutex> lock(cache->mutex);
    cache->cap = static_cast<size_t>(cap_bytes);
    if (cache->held > cache->cap) cache->release_locked();
  }
  if (c10::GetCPUAllocator() == cache) return true;
  if (c10::GetCPUAllocator() != c10::GetDefaultCPUAllocator()) return false;
  cache->fallback = c10::GetDefaultCPUAllocator();
  pthread_atfork(block_cache::lock_for_fork, block_cache::unlock_after_fork, block_cache::unlock_after_fork);
  c10::SetCPUAllocator(cache, /*priority=*/1);
  return c10::GetCPUAllocator() == cache;
}

// Hands every block on the free lists back to the C library.
void release_freed_blocks() { block_cache::cache->release(); }

// (bytes on the free lists, requests served from them, requests that were not) since the process began.
std::vector<int64_t> freed_block_stats() {
  using block_cache::cache;
  std::lock_guard<std::mutex> lock(cache->mutex);
  return {static_cast<int64_t>(cache->held), cache->hits, cache->misses};
}
