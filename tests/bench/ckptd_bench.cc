// ckptd-bench: the measurements behind scripts/bench.sh. Three modes:
//
//   raw      --dir D --bytes B --files N   O_DIRECT sequential write (+fdatasync) and read
//            of B bytes split over N concurrent files; the restore's read ceilings (the
//            same bytes read with O_DIRECT into distinct memory, pre-faulted and fresh,
//            the best of 2 and 4 threads); and memcpy of B bytes into reused and into
//            first-touch memory: the baselines ckptd is held against.
//   save     --socket T --bytes B          under mpirun, one process per trainer: each
//            trainer saves its row slab of 8 float32 tensors (B bytes in all), then
//            restores it, then restores a different cut (reshard), over shared memory and
//            over the gRPC stream. --net-interface IF adds the bytes each host sent and
//            received on IF during each measured save and restore (the most of any host).
//            --restore-only skips the saves and restores the step an earlier run saved.
//            The same-cut restore also runs into targets in the client's HostBuffers
//            (the daemon writes them itself), on a step of its own (6 steps are saved
//            with the data-parallel restore, 5 without).
//   metadata --socket T --counts 1000,...  one trainer saves, commits and restores N
//            tensors of 1 KiB each.
//   grpc     --socket T --dir D --bytes B   one trainer: B bytes each way through a plain
//            gRPC service on a unix socket in D (the baseline: buffer to buffer in 4 MiB
//            messages, nothing else done with them), then ckptd's Save and Restore of
//            the same bytes over the gRPC stream and over shared memory. Against daemons
//            with memory_steps, the restores read from daemon memory, not the disk.
//
// Prints one JSON object (from rank 0). Not a test: numbers vary with the machine.
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/plain_transport.grpc.pb.h"
#include "ckptd/client.h"
#include "ckptd/v1/wire.h"
#include "grpcpp/grpcpp.h"

namespace {

using json = nlohmann::json;

double Seconds(absl::Time since) { return absl::ToDoubleSeconds(absl::Now() - since); }

char* AlignedAlloc(size_t n) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, n) != 0) {
    std::cerr << "out of memory" << std::endl;
    std::abort();
  }
  std::memset(p, 1, n);  // pre-fault: the baselines measure copies, not page faults
  return static_cast<char*>(p);
}

int Fail(const std::string& what) {
  std::cerr << "ckptd-bench: " << what << std::endl;
  MPI_Abort(MPI_COMM_WORLD, 2);
  return 2;
}

// Drops the page cache so that the next read comes from the disk (root only; every
// simulated host shares this kernel). False where it is not permitted.
bool DropPageCache() {
  ::sync();
  std::ofstream drop("/proc/sys/vm/drop_caches");
  drop << "3" << std::endl;
  return drop.good();
}

// Tells the compiler that the bytes at p are used, so that a copy into memory freed
// right after it is not optimized away (what benchmark::DoNotOptimize does).
void KeepWritten(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// --- raw baselines ------------------------------------------------------------------

json Raw(const std::string& dir, int64_t bytes, int files) {
  constexpr size_t kBlock = 8 << 20;
  const int64_t per_file = bytes / files / kBlock * kBlock;
  std::vector<char*> buffers;
  for (int f = 0; f < files; ++f) buffers.push_back(AlignedAlloc(kBlock));
  auto run = [&](bool write) {
    std::vector<std::thread> threads;
    const absl::Time start = absl::Now();
    for (int f = 0; f < files; ++f) {
      threads.emplace_back([&, f] {
        const std::string path = absl::StrCat(dir, "/raw-", f);
        int fd = ::open(path.c_str(), (write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY) | O_DIRECT, 0644);
        if (fd < 0) fd = ::open(path.c_str(), write ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
        for (int64_t off = 0; off < per_file; off += kBlock) {
          const ssize_t n =
              write ? ::pwrite(fd, buffers[f], kBlock, off) : ::pread(fd, buffers[f], kBlock, off);
          if (n != static_cast<ssize_t>(kBlock)) std::abort();
        }
        if (write) ::fdatasync(fd);
        ::close(fd);
      });
    }
    for (auto& t : threads) t.join();
    return static_cast<double>(per_file * files) / Seconds(start) / 1e9;
  };
  const double write_gbps = run(true);
  const double read_gbps = run(false);
  for (char* b : buffers) std::free(b);
  // The read ceiling of a restore: every byte of the files to an address of its own, as
  // a restore must deliver them, with `threads` threads each reading a contiguous share
  // in 8 MiB O_DIRECT reads. Into memory touched before (a process that has restored
  // before) and into memory never touched (a process's first restore: the kernel
  // faults each page in as the read lands).
  const int64_t read_bytes = per_file * files;
  auto read_distinct = [&](int threads, char* into) {
    const int64_t blocks = read_bytes / static_cast<int64_t>(kBlock);
    std::vector<std::thread> pool;
    const absl::Time start = absl::Now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        std::vector<int> fds(static_cast<size_t>(files), -1);
        for (int64_t b = blocks * t / threads; b < blocks * (t + 1) / threads; ++b) {
          const int64_t at = b * static_cast<int64_t>(kBlock);
          const int f = static_cast<int>(at / per_file);
          if (fds[f] < 0) {
            const std::string path = absl::StrCat(dir, "/raw-", f);
            fds[f] = ::open(path.c_str(), O_RDONLY | O_DIRECT);
            if (fds[f] < 0) fds[f] = ::open(path.c_str(), O_RDONLY);
          }
          if (::pread(fds[f], into + at, kBlock, at % per_file) != static_cast<ssize_t>(kBlock)) std::abort();
        }
        for (int fd : fds) {
          if (fd >= 0) ::close(fd);
        }
      });
    }
    for (auto& t : pool) t.join();
    return static_cast<double>(read_bytes) / Seconds(start) / 1e9;
  };
  json distinct;
  for (const bool fresh : {false, true}) {
    double best = 0;
    int best_threads = 0;
    for (const int threads : {2, 4}) {
      char* into = nullptr;
      if (fresh) {
        void* p = nullptr;
        if (posix_memalign(&p, 4096, static_cast<size_t>(read_bytes)) != 0) std::abort();
        into = static_cast<char*>(p);  // large: its own mapping, never touched
      } else {
        into = AlignedAlloc(static_cast<size_t>(read_bytes));
      }
      const double gbps = read_distinct(threads, into);
      KeepWritten(into);
      std::free(into);
      if (gbps > best) best = gbps, best_threads = threads;
    }
    const std::string kind = fresh ? "fresh" : "prefaulted";
    distinct[absl::StrCat("read_", kind, "_gbps")] = best;
    distinct[absl::StrCat("read_", kind, "_threads")] = best_threads;
  }
  for (int f = 0; f < files; ++f) ::unlink(absl::StrCat(dir, "/raw-", f).c_str());
  char* src = AlignedAlloc(static_cast<size_t>(bytes));
  char* dst = AlignedAlloc(static_cast<size_t>(bytes));
  absl::Time start = absl::Now();
  std::memcpy(dst, src, static_cast<size_t>(bytes));
  KeepWritten(dst);
  const double memcpy_seconds = Seconds(start);
  std::free(dst);
  // The same copy into memory never touched before: what a process's first save pays
  // at best when each page is faulted in as it is written (the first-save baseline).
  void* fresh = nullptr;
  if (posix_memalign(&fresh, 4096, static_cast<size_t>(bytes)) != 0) std::abort();
  start = absl::Now();
  std::memcpy(fresh, src, static_cast<size_t>(bytes));
  KeepWritten(fresh);
  const double first_touch_seconds = Seconds(start);
  std::free(fresh);
  std::free(src);
  return {{"read_prefaulted_gbps", distinct["read_prefaulted_gbps"]},
          {"read_prefaulted_threads", distinct["read_prefaulted_threads"]},
          {"read_fresh_gbps", distinct["read_fresh_gbps"]},
          {"read_fresh_threads", distinct["read_fresh_threads"]},
          {"raw_write_gbps", write_gbps},
          {"raw_read_gbps", read_gbps},
          {"memcpy_gbps", static_cast<double>(bytes) / memcpy_seconds / 1e9},
          {"memcpy_s", memcpy_seconds},
          {"first_touch_memcpy_gbps", static_cast<double>(bytes) / first_touch_seconds / 1e9},
          {"first_touch_memcpy_s", first_touch_seconds}};
}

// --- the ckptd path -------------------------------------------------------------------

constexpr int kTensors = 8;

struct Model {
  int64_t rows = 0, cols = 0;  // of each tensor; this trainer holds rows [rows/T*t, ...)
  std::vector<char*> slabs;    // this trainer's slab of each tensor
  int64_t slab_bytes = 0;
};

double MaxOver(double local) {
  double out = 0;
  MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return out;
}

// {received, sent} bytes on `interface` in this process's network namespace
// (/proc/net/dev is per namespace, so on a simulated host it is that host's NIC).
std::array<int64_t, 2> InterfaceBytes(const std::string& interface) {
  std::ifstream in("/proc/net/dev");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || absl::StripAsciiWhitespace(line.substr(0, colon)) != interface)
      continue;
    std::istringstream fields(line.substr(colon + 1));
    std::array<int64_t, 9> v{};  // rx bytes, 7 more rx fields, tx bytes
    for (int64_t& x : v) fields >> x;
    return {v[0], v[8]};
  }
  return {0, 0};
}

// Counts what the hosts' NICs carry during one measured phase: Start after the phase's
// barrier, Stop after its closing collective; Stop returns the most any host received
// and sent (trainers on one host read the same counters).
class NetMeter {
 public:
  explicit NetMeter(std::string interface) : interface_(std::move(interface)) {}
  void Start() { start_ = InterfaceBytes(interface_); }
  json Stop() const {
    const std::array<int64_t, 2> now = InterfaceBytes(interface_);
    std::array<int64_t, 2> delta = {now[0] - start_[0], now[1] - start_[1]}, most{};
    MPI_Allreduce(delta.data(), most.data(), 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
    return {{"received", most[0]}, {"sent", most[1]}};
  }

 private:
  std::string interface_;
  std::array<int64_t, 2> start_{};
};

json Save(const std::string& socket_template, int64_t bytes, int daemons, const std::string& net_interface,
          bool restore_only, bool data_parallel) {
  int rank = 0, trainers = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &trainers);
  const std::string address =
      absl::StrReplaceAll(socket_template, {{"{rank}", std::to_string(rank * daemons / trainers)}});
  auto connect = [&] {
    auto client = ckptd::Client::Connect(address, absl::Seconds(60));
    if (!client.ok()) Fail(std::string(client.status().message()));
    return std::move(*client);
  };
  std::unique_ptr<ckptd::Client> client = connect();
  Model m;
  m.cols = 1024;
  m.rows = bytes / kTensors / (m.cols * 4) / (2 * trainers) * (2 * trainers);
  m.slab_bytes = m.rows / trainers * m.cols * 4;
  for (int i = 0; i < kTensors; ++i) m.slabs.push_back(AlignedAlloc(static_cast<size_t>(m.slab_bytes)));
  const int64_t total = m.slab_bytes * kTensors * trainers;
  auto shards = [&](int64_t step) {
    std::vector<ckptd::TensorShard> out;
    for (int i = 0; i < kTensors; ++i) {
      std::memset(m.slabs[i], static_cast<int>(step + i), 64);  // contents change per step
      out.push_back({absl::StrCat("layer", i, "/kernel"),
                     ckptd::kDtFloat,
                     {m.rows, m.cols},
                     {m.rows / trainers * rank, 0},
                     {m.rows / trainers, m.cols},
                     m.slabs[i],
                     static_cast<size_t>(m.slab_bytes)});
    }
    return out;
  };
  // One save: returns (this trainer's stall, save-to-durable seconds over all trainers).
  NetMeter meter(net_interface);
  json net_per_host;  // phase -> the most bytes one host received and sent
  auto save = [&](int64_t step, ckptd::Transport transport) {
    ckptd::SaveOptions options;
    options.transport = transport;
    const std::vector<ckptd::TensorShard> s = shards(step);
    MPI_Barrier(MPI_COMM_WORLD);
    meter.Start();
    const absl::Time start = absl::Now();
    auto saved = client->Save("bench", step, rank, trainers, s, options);
    const double stall = Seconds(start);
    if (!saved.ok()) Fail(std::string(saved.status().message()));
    if (absl::Status w = client->Wait("bench", step); !w.ok()) Fail(std::string(w.message()));
    const double durable = Seconds(start);
    auto out = std::make_pair(MaxOver(stall), MaxOver(durable));
    net_per_host[transport == ckptd::Transport::kStream ? "grpc_save" : "save"] = meter.Stop();
    return out;
  };
  // Bytes of data files the daemons read from storage for restores so far: each
  // daemon's counter, taken by the first trainer on it, summed over the job.
  const int my_daemon = rank * daemons / trainers;
  const bool first_on_daemon = rank == 0 || (rank - 1) * daemons / trainers != my_daemon;
  auto storage_read = [&] {
    int64_t mine = 0;
    if (first_on_daemon) {
      auto status = client->Status();
      if (!status.ok()) Fail(std::string(status.status().message()));
      mine = status->restore_storage_bytes_read();
    }
    int64_t sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    return sum;
  };
  json storage_bytes;  // phase -> bytes read from storage by all daemons
  // Restores every tensor's box (start row, rows) into reused buffers.
  // Allocated once the saves are done (below), so that the saves' memory and the
  // restores' are not held at once.
  std::vector<char*> targets;
  // Every restore is cold: the page cache is dropped before it where permitted.
  bool page_cache_dropped = true;
  std::unique_ptr<ckptd::HostBuffer> host_buffer;  // one for all tensors, when used
  auto restore = [&](int64_t step, int64_t first_row, int64_t rows, const char* phase,
                     bool into_host_buffer = false) {
    std::vector<ckptd::RestoreTarget> t;
    for (int i = 0; i < kTensors; ++i) {
      const size_t size = static_cast<size_t>(rows * m.cols * 4);
      t.push_back(
          {absl::StrCat("layer", i, "/kernel"), 0, {}, {first_row, 0}, {rows, m.cols}, targets[i], size});
      if (into_host_buffer) {
        t.back().data = host_buffer->data() + i * size;
        t.back().host_buffer = host_buffer.get();
      }
    }
    const int64_t read_before = storage_read();
    if (rank == 0) page_cache_dropped = DropPageCache() && page_cache_dropped;
    MPI_Barrier(MPI_COMM_WORLD);
    meter.Start();
    const absl::Time start = absl::Now();
    auto restored = client->Restore("bench", step, t);
    if (!restored.ok()) Fail(std::string(restored.status().message()));
    const double seconds = MaxOver(Seconds(start));
    net_per_host[phase] = meter.Stop();
    storage_bytes[phase] = storage_read() - read_before;
    return seconds;
  };
  const int64_t slab_rows = m.rows / trainers;
  json out;
  if (!restore_only) {
    const double gb = static_cast<double>(total) / 1e9;
    auto [cold_stall, cold_durable] = save(1, ckptd::Transport::kAuto);  // first touch of segments and pools
    auto [stall, durable] = save(2, ckptd::Transport::kAuto);
    save(3, ckptd::Transport::kStream);  // the stream path's first use, like step 1
    auto [grpc_stall, grpc_durable] = save(4, ckptd::Transport::kStream);
    save(5, ckptd::Transport::kAuto);                     // each restore below reads a step of its own
    if (data_parallel) save(6, ckptd::Transport::kAuto);  // the data-parallel restore takes 5
    out = {{"stall_s", stall},
           {"cold_stall_s", cold_stall},
           {"save_s", durable},
           {"save_gbps", gb / durable},
           {"cold_save_gbps", gb / cold_durable},
           {"grpc_stall_s", grpc_stall},
           {"grpc_save_gbps", gb / grpc_durable}};
  }
  // The saves' memory goes before the restores need theirs (the data-parallel restore
  // alone takes the whole model per trainer): the slabs, and the client's pooled
  // shared-memory segments, which a new connection does not inherit.
  for (char*& p : m.slabs) {
    std::free(p);
    p = nullptr;
  }
  client = connect();
  // Big enough for the largest restore below: the whole tensor (the data-parallel
  // restore) or, without it, a row half (the reshard), which also holds this trainer's slab.
  const int64_t target_bytes = (data_parallel ? m.rows : m.rows / 2) * m.cols * 4;
  for (int i = 0; i < kTensors; ++i) {
    // A trainer restores into memory it already uses: touched before timing.
    targets.push_back(AlignedAlloc(static_cast<size_t>(target_bytes)));
    std::memset(targets.back(), 0, static_cast<size_t>(target_bytes));
  }
  // Each restore runs twice: the first also pays for first touch of the client's
  // segment (page faults), which a trainer pays once per process; the second is the
  // steady state and is the one compared with the raw read.
  // Each phase reads a step of its own, so that none finds the blocks the one before
  // left in the daemons' read caches.
  const double cold_restore_s = restore(1, slab_rows * rank, slab_rows, "cold_restore");
  const double restore_s = restore(2, slab_rows * rank, slab_rows, "restore");
  // Reshard: two row halves instead of `trainers` slabs; trainers t and t+2 share one.
  const double cold_reshard_s = restore(3, (rank % 2) * (m.rows / 2), m.rows / 2, "cold_reshard_restore");
  const double reshard_s = restore(4, (rank % 2) * (m.rows / 2), m.rows / 2, "reshard_restore");
  // Data-parallel: every trainer restores the whole model.
  const double dp_s = data_parallel ? restore(5, 0, m.rows, "dp_restore") : 0;
  for (char* p : targets) std::free(p);
  // The same-cut restore into HostBuffers (step 6, or 5 without the data-parallel
  // restore), run twice like the others (the first also pays the daemon's first
  // mapping of the buffer).
  double host_s = 0, cold_host_s = 0;
  {
    const int64_t host_step = data_parallel ? 6 : 5;
    auto buffer = ckptd::HostBuffer::Allocate(static_cast<size_t>(m.slab_bytes * kTensors));
    if (!buffer.ok()) Fail(std::string(buffer.status().message()));
    host_buffer = *std::move(buffer);
    std::memset(host_buffer->data(), 0, host_buffer->size());  // memory a trainer already uses
    cold_host_s = restore(host_step, slab_rows * rank, slab_rows, "cold_host_buffer_restore", true);
    host_s = restore(host_step, slab_rows * rank, slab_rows, "host_buffer_restore", true);
  }
  const double gb = static_cast<double>(total) / 1e9;
  out.update({{"bytes", total},
              {"trainers", trainers},
              {"daemons", daemons},
              {"restore_s", restore_s},
              {"cold_restore_gbps", gb / cold_restore_s},
              {"cold_reshard_restore_gbps", 2 * gb / cold_reshard_s},
              {"restore_gbps", gb / restore_s},
              {"host_buffer_restore_gbps", host_s > 0 ? gb / host_s : 0.0},
              {"cold_host_buffer_restore_gbps", cold_host_s > 0 ? gb / cold_host_s : 0.0},
              {"reshard_restore_s", reshard_s},
              // Every trainer receives half of every tensor: twice the checkpoint's bytes.
              {"reshard_restore_gbps", 2 * gb / reshard_s},
              // Every trainer receives everything: `trainers` times the checkpoint's bytes.
              {"dp_restore_gbps", data_parallel ? trainers * gb / dp_s : 0.0},
              {"dp_restore_delivered_bytes", trainers * total},
              {"storage_bytes", storage_bytes},
              {"page_cache_dropped", page_cache_dropped}});
  if (!net_interface.empty()) out["net_per_host"] = net_per_host;
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

json Metadata(const std::string& socket_template, const std::vector<int64_t>& counts, int rounds) {
  auto client =
      ckptd::Client::Connect(absl::StrReplaceAll(socket_template, {{"{rank}", "0"}}), absl::Seconds(60));
  if (!client.ok()) Fail(std::string(client.status().message()));
  json out = json::array();
  std::vector<char> data(1024, 7);
  int64_t step = 100;
  for (int64_t n : counts) {
    std::vector<ckptd::TensorShard> shards;
    std::vector<std::string> names;
    for (int64_t i = 0; i < n; ++i) names.push_back(absl::StrCat("t", i));
    std::vector<std::vector<char>> back(static_cast<size_t>(n), std::vector<char>(1024));
    std::vector<ckptd::RestoreTarget> targets;
    for (int64_t i = 0; i < n; ++i) {
      shards.push_back({names[i], ckptd::kDtUint8, {1024}, {}, {}, data.data(), data.size()});
      targets.push_back({.name = names[i], .dtype = 0, .data = back[i].data(), .size = back[i].size()});
    }
    // Each count runs `rounds` times (a step each); the median of each figure is
    // reported, this machine's run-to-run noise being larger than the effect measured.
    std::vector<double> save_times, commit_times, restore_times, totals;
    for (int round = 0; round < rounds; ++round) {
      ++step;
      absl::Time start = absl::Now();
      auto saved = (*client)->Save("meta", step, 0, 1, shards);
      if (!saved.ok()) Fail(std::string(saved.status().message()));
      const double save_s = Seconds(start);
      if (absl::Status w = (*client)->Wait("meta", step); !w.ok()) Fail(std::string(w.message()));
      const double commit_s = Seconds(start) - save_s;
      start = absl::Now();
      auto restored = (*client)->Restore("meta", step, targets);
      if (!restored.ok()) Fail(std::string(restored.status().message()));
      const double restore_s = Seconds(start);
      save_times.push_back(save_s);
      commit_times.push_back(commit_s);
      restore_times.push_back(restore_s);
      totals.push_back(save_s + commit_s + restore_s);
    }
    out.push_back({{"tensors", n},
                   {"rounds", rounds},
                   {"save_s", Median(save_times)},
                   {"commit_s", Median(commit_times)},
                   {"restore_s", Median(restore_times)},
                   {"total_s", Median(totals)},
                   {"total_s_each", totals}});
  }
  return out;
}

// --- the gRPC stream against plain gRPC -------------------------------------------------

// Bytes arriving at either end of the plain service land in a reused buffer of this
// size (a ring), as a receiver that keeps them would copy them somewhere.
constexpr size_t kRingBytes = size_t{64} << 20;
constexpr size_t kChunkBytes = ckptd::wire::kSaveChunkBytes;  // the messages ckptd's stream sends

// Copies `n` received bytes that arrived `offset` bytes into a stream into the ring.
void IntoRing(char* ring, int64_t offset, const std::string& data) {
  size_t at = static_cast<size_t>(offset) % kRingBytes, done = 0;
  while (done < data.size()) {
    const size_t n = std::min(data.size() - done, kRingBytes - at);
    std::memcpy(ring + at, data.data() + done, n);
    done += n;
    at = 0;
  }
}

class PlainTransportService final : public ckptd::bench::PlainTransport::Service {
 public:
  explicit PlainTransportService(const char* source) : source_(source), ring_(AlignedAlloc(kRingBytes)) {}
  ~PlainTransportService() override { std::free(ring_); }

  grpc::Status Sink(grpc::ServerContext*, grpc::ServerReader<ckptd::bench::Chunk>* reader,
                    ckptd::bench::Received* response) override {
    ckptd::bench::Chunk chunk;
    int64_t received = 0;
    while (reader->Read(&chunk)) {
      IntoRing(ring_, received, chunk.data());
      received += static_cast<int64_t>(chunk.data().size());
    }
    response->set_bytes(received);
    return grpc::Status::OK;
  }
  grpc::Status Source(grpc::ServerContext*, const ckptd::bench::SourceRequest* request,
                      grpc::ServerWriter<ckptd::bench::Chunk>* writer) override {
    ckptd::bench::Chunk chunk;
    for (int64_t off = 0; off < request->bytes(); off += request->chunk_bytes()) {
      const int64_t n = std::min(request->chunk_bytes(), request->bytes() - off);
      chunk.mutable_data()->assign(source_ + off, static_cast<size_t>(n));
      if (!writer->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }

 private:
  const char* source_;  // at least the bytes any Source asks for
  char* ring_;
};

constexpr int kPlainMessageLimit = ckptd::wire::kMaxMessageBytes;  // as ckptd's daemon and client

// `ckptd-bench plain-grpc-server SOCKET BYTES`: serves the baseline until SIGTERM, with
// BYTES of pre-faulted memory to send from. Runs before (and without) MPI_Init.
int ServePlainGrpc(const std::string& socket, int64_t bytes) {
  char* source = AlignedAlloc(static_cast<size_t>(bytes));
  ::unlink(socket.c_str());
  PlainTransportService service(source);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(kPlainMessageLimit);
  builder.SetMaxSendMessageSize(kPlainMessageLimit);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::cerr << "ckptd-bench: cannot serve plain gRPC on " << socket << std::endl;
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  int signal = 0;
  sigwait(&stop, &signal);  // SIGTERM is blocked in every thread (see main)
  // The client has finished with it: nothing in flight to wait for.
  server->Shutdown(std::chrono::system_clock::now());
  std::free(source);
  return 0;
}

pid_t SpawnPlainServer(const std::string& socket, int64_t bytes) {
  const std::string bytes_text = std::to_string(bytes);
  std::vector<char*> argv = {const_cast<char*>("ckptd-bench"), const_cast<char*>("plain-grpc-server"),
                             const_cast<char*>(socket.c_str()), const_cast<char*>(bytes_text.c_str()),
                             nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
    Fail("cannot start the plain gRPC server");
  }
  return pid;
}

json Grpc(const std::string& socket_template, const std::string& dir, int64_t bytes, int rounds) {
  // One trainer's model: 8 float32 tensors of B/8 bytes each.
  const int64_t cols = 1024;
  const int64_t rows = std::max<int64_t>(1, bytes / kTensors / (cols * 4));
  const int64_t tensor_bytes = rows * cols * 4;
  const int64_t total = tensor_bytes * kTensors;
  char* source = AlignedAlloc(static_cast<size_t>(total));
  char* target = AlignedAlloc(static_cast<size_t>(total));
  const double gb = static_cast<double>(total) / 1e9;

  // The baseline: a plain service in a process of its own (as the daemon is), on a
  // unix socket, with the message limits ckptd's daemon and client use.
  const std::string plain_socket = absl::StrCat(dir, "/plain-grpc.sock");
  const pid_t server = SpawnPlainServer(plain_socket, total);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kPlainMessageLimit);
  args.SetMaxSendMessageSize(kPlainMessageLimit);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);  // as ckptd's client: the server starts now
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  auto channel = grpc::CreateCustomChannel("unix:" + plain_socket, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(60)))) {
    ::kill(server, SIGKILL);
    Fail("the plain gRPC server did not come up on " + plain_socket);
  }
  auto stub = ckptd::bench::PlainTransport::NewStub(channel);
  auto plain_send = [&] {
    const absl::Time start = absl::Now();
    grpc::ClientContext ctx;
    ckptd::bench::Received received;
    auto writer = stub->Sink(&ctx, &received);
    ckptd::bench::Chunk chunk;
    for (int64_t off = 0; off < total; off += static_cast<int64_t>(kChunkBytes)) {
      chunk.mutable_data()->assign(source + off,
                                   std::min<size_t>(kChunkBytes, static_cast<size_t>(total - off)));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (!status.ok() || received.bytes() != total) Fail("plain gRPC send: " + status.error_message());
    return Seconds(start);
  };
  auto plain_receive = [&] {
    const absl::Time start = absl::Now();
    grpc::ClientContext ctx;
    ckptd::bench::SourceRequest request;
    request.set_bytes(total);
    request.set_chunk_bytes(static_cast<int64_t>(kChunkBytes));
    auto reader = stub->Source(&ctx, request);
    ckptd::bench::Chunk chunk;
    int64_t received = 0;
    while (reader->Read(&chunk)) {
      std::memcpy(target + received, chunk.data().data(), chunk.data().size());
      received += static_cast<int64_t>(chunk.data().size());
    }
    grpc::Status status = reader->Finish();
    if (!status.ok() || received != total) Fail("plain gRPC receive: " + status.error_message());
    return Seconds(start);
  };

  auto client =
      ckptd::Client::Connect(absl::StrReplaceAll(socket_template, {{"{rank}", "0"}}), absl::Seconds(60));
  if (!client.ok()) Fail(std::string(client.status().message()));
  auto status = (*client)->Status();
  if (!status.ok()) Fail(std::string(status.status().message()));
  const bool from_memory = status->memory_steps_limit() > 0;
  std::vector<ckptd::TensorShard> shards;
  std::vector<ckptd::RestoreTarget> targets;
  for (int i = 0; i < kTensors; ++i) {
    const std::string name = absl::StrCat("layer", i, "/kernel");
    shards.push_back({name,
                      ckptd::kDtFloat,
                      {rows, cols},
                      {},
                      {},
                      source + i * tensor_bytes,
                      static_cast<size_t>(tensor_bytes)});
    targets.push_back({.name = name,
                       .dtype = 0,
                       .data = target + i * tensor_bytes,
                       .size = static_cast<size_t>(tensor_bytes)});
  }
  int64_t step = 0;
  auto save = [&](ckptd::Transport transport) {
    ckptd::SaveOptions options;
    options.transport = transport;
    source[0] = static_cast<char>(++step);  // each step's bytes differ
    const absl::Time start = absl::Now();
    auto saved = (*client)->Save("grpc", step, 0, 1, shards, options);
    const double seconds = Seconds(start);
    if (!saved.ok()) Fail(std::string(saved.status().message()));
    if (absl::Status w = (*client)->Wait("grpc", step); !w.ok()) Fail(std::string(w.message()));
    return seconds;
  };
  auto restore = [&](ckptd::Transport transport) {
    ckptd::RestoreOptions options;
    options.transport = transport;
    const absl::Time start = absl::Now();
    auto restored = (*client)->Restore("grpc", step, targets, options);
    const double seconds = Seconds(start);
    if (!restored.ok()) Fail(std::string(restored.status().message()));
    if (std::memcmp(source, target, static_cast<size_t>(total)) != 0)
      Fail("restored bytes differ from saved");
    return seconds;
  };
  // A first round of each warms what a process pays once (segments, pools, channels).
  plain_send();
  plain_receive();
  save(ckptd::Transport::kStream);
  restore(ckptd::Transport::kStream);
  save(ckptd::Transport::kSharedMemory);
  restore(ckptd::Transport::kSharedMemory);
  std::vector<double> send_s, receive_s, stream_save_s, stream_restore_s, shm_save_s, shm_restore_s;
  for (int round = 0; round < rounds; ++round) {
    send_s.push_back(plain_send());
    receive_s.push_back(plain_receive());
    stream_save_s.push_back(save(ckptd::Transport::kStream));
    stream_restore_s.push_back(restore(ckptd::Transport::kStream));
    shm_save_s.push_back(save(ckptd::Transport::kSharedMemory));
    shm_restore_s.push_back(restore(ckptd::Transport::kSharedMemory));
  }
  ::kill(server, SIGTERM);
  ::waitpid(server, nullptr, 0);
  std::free(source);
  std::free(target);
  auto gbps = [&](const std::vector<double>& seconds) { return gb / Median(seconds); };
  return {{"bytes", total},
          {"rounds", rounds},
          {"restores_from_memory", from_memory},
          {"plain_grpc_send_gbps", gbps(send_s)},
          {"plain_grpc_receive_gbps", gbps(receive_s)},
          {"stream_save_gbps", gbps(stream_save_s)},
          {"stream_restore_gbps", gbps(stream_restore_s)},
          {"shm_save_gbps", gbps(shm_save_s)},
          {"shm_restore_gbps", gbps(shm_restore_s)},
          {"stream_save_vs_plain_grpc", gbps(stream_save_s) / gbps(send_s)},
          {"stream_restore_vs_plain_grpc", gbps(stream_restore_s) / gbps(receive_s)}};
}

}  // namespace

int main(int argc, char** argv) {
  // Every process of the bench keeps freed memory for reuse, as ckptd's daemon does and
  // as its client docs advise trainers: gRPC's 4 MiB message buffers are then reused,
  // not faulted in afresh for every message, on the plain baseline's side and on
  // ckptd's alike, so neither figure is one slowed by page faults.
  ckptd::KeepFreedMemoryForReuse();
  if (argc == 4 && std::string(argv[1]) == "plain-grpc-server") {
    // The grpc mode's baseline server, a child of that mode: no MPI, no CLI.
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before gRPC starts its threads
    return ServePlainGrpc(argv[2], std::stoll(argv[3]));
  }
  MPI_Init(&argc, &argv);
  CLI::App app{"ckptd-bench: baselines and ckptd measurements for scripts/bench.sh"};
  std::string mode, dir, socket, net_interface, counts_text = "1000,10000,100000";
  int64_t bytes = int64_t{2} << 30;
  int files = 2, daemons = 2;
  app.add_option("MODE", mode, "raw, save, metadata or grpc")
      ->required()
      ->check(CLI::IsMember({"raw", "save", "metadata", "grpc"}));
  app.add_option("--dir", dir, "raw: directory for the baseline files; grpc: for the plain service's socket");
  app.add_option("--bytes", bytes, "bytes in all");
  app.add_option("--files", files, "raw: concurrent files");
  app.add_option("--socket", socket, "daemon socket template, {rank} = daemon rank");
  app.add_option("--daemons", daemons, "save: daemons in the job (trainers spread evenly)");
  app.add_option("--counts", counts_text, "metadata: tensor counts");
  int rounds = 3;
  app.add_option("--rounds", rounds, "metadata, grpc: runs of each figure (the median is reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--net-interface", net_interface, "save: also count each host's bytes on this interface");
  bool restore_only = false;
  app.add_flag("--restore-only", restore_only, "save: only the restores, of the step an earlier run saved");
  bool no_data_parallel = false;
  app.add_flag("--no-data-parallel", no_data_parallel,
               "save: leave out the data-parallel restore (every trainer the whole model in memory)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    MPI_Finalize();
    return code;
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  json out;
  if (mode == "raw") {
    out = Raw(dir, bytes, files);
  } else if (mode == "save") {
    out = Save(socket, bytes, daemons, net_interface, restore_only, !no_data_parallel);
  } else if (mode == "grpc") {
    out = Grpc(socket, dir, bytes, rounds);
  } else {
    std::vector<int64_t> counts;
    for (absl::string_view c : absl::StrSplit(counts_text, ',')) counts.push_back(std::stoll(std::string(c)));
    out = Metadata(socket, counts, rounds);
  }
  if (rank == 0) std::cout << out.dump() << std::endl;
  MPI_Finalize();
  return 0;
}
