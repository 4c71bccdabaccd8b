// TrainerMemory: the daemon's writes into a trainer's own memory, exercised against a
// forked child (the same addresses as this process, in another address space).
#include "daemon/staging/trainer_memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ckptd {
namespace {

uint64_t AddressOf(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A child that waits for one byte on a pipe, then exits 0 when `check` holds in its
// memory (1 otherwise); the parent writes into it meanwhile.
class Child {
 public:
  template <typename Check>
  explicit Child(Check check) {
    if (::pipe(go_) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      char c;
      const bool got = ::read(go_[0], &c, 1) == 1;
      ::_exit(got && check() ? 0 : 1);
    }
  }
  pid_t pid() const { return pid_; }
  // Lets the child check and returns whether its check held.
  bool Finish() {
    const bool wrote = ::write(go_[1], "x", 1) == 1;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    ::close(go_[0]);
    ::close(go_[1]);
    return wrote && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  int go_[2] = {-1, -1};
  pid_t pid_ = -1;
};

TEST(TrainerMemoryTest, WritesLandInTheTrainerAndNotHere) {
  std::vector<char> target(3 << 20, 0);  // touched, as a trainer's tensor is
  std::string bytes(target.size(), 0);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 1);
  Child child([&] { return std::memcmp(target.data(), bytes.data(), bytes.size()) == 0; });
  auto memory = TrainerMemory::Open(child.pid(), AddressOf(target.data()));
  ASSERT_TRUE(memory.ok()) << memory.status();
  // In two pieces, the second at an offset, as a restore's chunks arrive.
  ASSERT_TRUE((*memory)->Write(AddressOf(target.data()), {bytes.data(), 1000}).ok());
  ASSERT_TRUE(
      (*memory)->Write(AddressOf(target.data()) + 1000, {bytes.data() + 1000, bytes.size() - 1000}).ok());
  EXPECT_EQ(target[1], 0) << "this process's copy changed";
  EXPECT_TRUE(child.Finish());
}

TEST(TrainerMemoryTest, MemoryWithoutAccessIsInvalidArgumentAtOpenAndMidWrite) {
  const long page = ::sysconf(_SC_PAGESIZE);
  char* region = static_cast<char*>(
      ::mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(region, MAP_FAILED);
  std::memset(region, 0, 4 * page);
  // The third page without access (not unmapped: another thread could map the hole).
  ASSERT_EQ(::mprotect(region + 2 * page, page, PROT_NONE), 0);
  Child child([] { return true; });
  auto bad = TrainerMemory::Open(child.pid(), AddressOf(region + 2 * page));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  auto memory = TrainerMemory::Open(child.pid(), AddressOf(region));
  ASSERT_TRUE(memory.ok()) << memory.status();
  const std::string bytes(3 * page, 'x');
  absl::Status s = (*memory)->Write(AddressOf(region), bytes);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("not writable"), std::string::npos) << s;
  EXPECT_TRUE(child.Finish());
  ::munmap(region, 4 * page);
}

TEST(TrainerMemoryTest, ATrainerThatExitedIsCancelledNeverWritten) {
  std::vector<char> target(4096, 0);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  auto memory = TrainerMemory::Open(child, AddressOf(target.data()));
  // Open may run before or after the child exits (it stays a zombie until reaped):
  // either Open or the write says it has gone.
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  if (memory.ok()) {
    absl::Status s = (*memory)->Write(AddressOf(target.data()), std::string(16, 'x'));
    EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  } else {
    EXPECT_EQ(memory.status().code(), absl::StatusCode::kCancelled) << memory.status();
  }
  ::waitpid(child, nullptr, 0);
  auto reaped = TrainerMemory::Open(child, AddressOf(target.data()));
  EXPECT_EQ(reaped.status().code(), absl::StatusCode::kCancelled) << reaped.status();
}

TEST(TrainerMemoryTest, WithoutPtraceAccessOpenIsPermissionDenied) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to drop to another user in a child";
  // A child of another user may not ptrace this (root's) process: what a daemon meets
  // where the kernel refuses it.
  std::vector<char> target(4096, 0);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(2);
    auto memory = TrainerMemory::Open(parent, AddressOf(target.data()));
    ::_exit(absl::IsPermissionDenied(memory.status()) ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not drop to nobody; 1: Open was not PERMISSION_DENIED";
}

}  // namespace
}  // namespace ckptd
