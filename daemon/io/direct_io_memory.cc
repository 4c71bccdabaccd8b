#include "daemon/io/direct_io_memory.h"

#include <atomic>
#include <cstdint>
#include <map>

#include "absl/synchronization/mutex.h"

namespace ckptd::direct_io_memory {
namespace {

constexpr uintptr_t kAlignment = 4096;

absl::Mutex& Mu() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

// begin -> end of each registered range (written under Mu() held exclusively).
std::map<uintptr_t, uintptr_t>& Ranges() ABSL_SHARED_LOCKS_REQUIRED(Mu()) {
  static auto* ranges = new std::map<uintptr_t, uintptr_t>;
  return *ranges;
}

std::atomic<uint64_t> in_place_bytes{0};

}  // namespace

void Add(const void* begin, size_t bytes) {
  if (begin == nullptr || bytes == 0) return;
  const auto at = reinterpret_cast<uintptr_t>(begin);
  absl::MutexLock lock(&Mu());
  Ranges()[at] = at + bytes;
}

void Remove(const void* begin) {
  absl::MutexLock lock(&Mu());
  Ranges().erase(reinterpret_cast<uintptr_t>(begin));
}

bool Contains(const void* p, size_t n) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (p == nullptr || at % kAlignment != 0) return false;
  absl::ReaderMutexLock lock(&Mu());
  const std::map<uintptr_t, uintptr_t>& ranges = Ranges();
  auto it = ranges.upper_bound(at);
  if (it == ranges.begin()) return false;
  --it;
  return at < it->second && n <= it->second - at;
}

void CountInPlace(size_t bytes) { in_place_bytes.fetch_add(bytes, std::memory_order_relaxed); }

uint64_t InPlaceBytes() { return in_place_bytes.load(std::memory_order_relaxed); }

}  // namespace ckptd::direct_io_memory
