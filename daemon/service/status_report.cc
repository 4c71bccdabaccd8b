#include "daemon/service/status_report.h"

#include <unistd.h>

#include <map>

#include "daemon/io/direct_io_memory.h"

namespace ckptd {

std::vector<Metrics::Gauge> StatusGauges(const v1::StatusResponse& now) {
  std::vector<Metrics::Gauge> gauges = {
      {"ckptd_staged_bytes", "Bytes staged in daemon memory now (pending and in-flight steps).",
       static_cast<double>(now.bytes_staged())},
      {"ckptd_in_flight_bytes", "Staged bytes of steps being committed now.",
       static_cast<double>(now.bytes_in_flight())},
      {"ckptd_pooled_bytes", "Freed staging memory kept for reuse.", static_cast<double>(now.pooled_bytes())},
      {"ckptd_peak_staged_bytes", "Most bytes staged at once since start.",
       static_cast<double>(now.peak_bytes_staged())},
      {"ckptd_staging_memory_limit_bytes", "The staging budget.",
       static_cast<double>(now.staging_memory_limit())},
      {"ckptd_pending_steps", "Steps this daemon holds staged bytes of.",
       static_cast<double>(now.pending_steps_size())},
      {"ckptd_read_cache_bytes", "Bytes the read cache holds now.",
       static_cast<double>(now.read_cache_bytes())},
      {"ckptd_direct_io_in_place_bytes",
       "Bytes read into or written from trainers' huge-page segments with O_DIRECT in place (no copy "
       "through the daemon's own buffers), since start.",
       static_cast<double>(direct_io_memory::InPlaceBytes())},
      {"ckptd_build_info", "Always 1; the daemon's version is the label.", 1, {{"version", now.version()}}},
      {"ckptd_start_time_seconds", "When this daemon started, in seconds since the Unix epoch.",
       now.started_unix_seconds()},
  };
  if (now.root_free_bytes() >= 0) {
    gauges.push_back({"ckptd_root_free_bytes",
                      "Bytes still free to the daemon on its checkpoint root's file system.",
                      static_cast<double>(now.root_free_bytes())});
  }
  for (const v1::RunStatus& run : now.runs()) {
    if (run.last_commit_unix_seconds() <= 0) continue;
    gauges.push_back({"ckptd_last_commit_timestamp_seconds",
                      "When this daemon last committed a step of the run, in seconds since the Unix epoch.",
                      run.last_commit_unix_seconds(),
                      {{"run", run.run()}}});
  }
  return gauges;
}

v1::StatusResponse LocalStatusReport(const StatusSources& from) {
  v1::StatusResponse status;
  v1::StatusResponse* response = &status;
  response->set_rank(from.rank);
  response->set_peak_bytes_staged(from.staging->peak_bytes_staged());
  response->set_staging_memory_limit(from.staging->limit());
  response->set_tcp_address(from.tcp_address);
  response->set_metrics_address(from.metrics_address);
  response->set_num_ranks(from.num_ranks);
  response->set_version(from.version);
  const CheckpointStore* root = from.tiers->read_store();
  response->set_root(root->root());
  response->set_started_unix_seconds(absl::ToDoubleSeconds(from.started - absl::UnixEpoch()));
  response->set_root_free_bytes(from.root_free_bytes);
  response->set_pid(::getpid());
  for (const StepKey& key : from.registry->PendingSteps()) {
    v1::StepRef* ref = response->add_pending_steps();
    ref->set_run(key.run);
    ref->set_step(key.step);
  }
  for (const StepRegistry::GatheringStep& g : from.registry->Gathering()) {
    v1::GatheringStep* out = response->add_gathering();
    out->set_run(g.key.run);
    out->set_step(g.key.step);
    out->set_trainer_count(g.trainer_count);
    out->set_trainers_staged(g.trainers_staged);
    out->mutable_missing_trainers()->Add(g.missing.begin(), g.missing.end());
    out->set_deadline_unix_seconds(absl::ToDoubleSeconds(g.deadline - absl::UnixEpoch()));
  }
  for (const auto& [run, step] : from.registry->LastCommitted()) {
    v1::RunStatus* rs = response->add_runs();
    rs->set_run(run);
    rs->set_last_committed_step(step);
  }
  response->set_bytes_staged(from.staging->bytes_staged());
  response->set_bytes_written(from.registry->bytes_written());
  response->set_bytes_in_flight(from.registry->bytes_in_flight());
  response->set_pooled_bytes(from.staging->pooled_bytes());
  const DeviceStager::Totals device = from.device->CopyTotals();
  response->set_device_to_host_bytes(device.to_host_bytes);
  response->set_device_to_host_seconds(device.to_host_seconds);
  response->set_host_to_device_bytes(device.to_device_bytes);
  response->set_host_to_device_seconds(device.to_device_seconds);
  response->set_device_memory(from.device->Describe());
  const ReadCache* read_cache = from.tiers->read_cache();
  response->set_restore_storage_bytes_read(static_cast<int64_t>(read_cache->storage_bytes_read()));
  response->set_read_cache_hit_bytes(static_cast<int64_t>(read_cache->hit_bytes()));
  response->set_read_cache_bytes(static_cast<int64_t>(read_cache->held_bytes()));
  response->set_restore_bytes_delivered(static_cast<int64_t>(from.restorer->bytes_delivered()));
  response->set_restore_peer_bytes_received(static_cast<int64_t>(from.restorer->peer_bytes_received()));
  // Without a memory tier: a limit of 0 and no steps.
  const MemoryTier* memory_tier = from.tiers->memory_tier();
  response->set_memory_steps_limit(memory_tier->max_steps());
  for (const MemoryTier::Held& held : memory_tier->Steps()) {
    v1::KeptStep* kept = response->add_memory_steps();
    kept->set_run(held.key.run);
    kept->set_step(held.key.step);
    kept->set_bytes(held.bytes);
  }
  const std::map<std::string, StepRegistry::CommitTiming> timings = from.registry->LastCommitTimings();
  for (v1::RunStatus& rs : *response->mutable_runs()) {
    auto it = timings.find(rs.run());
    if (it == timings.end()) continue;
    rs.set_last_commit_unix_seconds(absl::ToDoubleSeconds(it->second.when - absl::UnixEpoch()));
    rs.set_last_commit_seconds(absl::ToDoubleSeconds(it->second.took));
  }
  return status;
}

}  // namespace ckptd
