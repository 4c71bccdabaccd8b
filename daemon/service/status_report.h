// What one daemon reports about itself: the Status RPC's answer for this rank (the
// other ranks' come from the coordinator's rounds) and the gauges of /metrics.
// Reads thread-safe accessors only, so any thread may build a report.
#ifndef CKPTD_DAEMON_SERVICE_STATUS_REPORT_H_
#define CKPTD_DAEMON_SERVICE_STATUS_REPORT_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "ckptd/v1/ckptd.pb.h"
#include "daemon/base/metrics.h"
#include "daemon/coord/step_registry.h"
#include "daemon/restore/restorer.h"
#include "daemon/staging/device_stager.h"
#include "daemon/staging/staging_area.h"
#include "daemon/tiers/storage_tiers.h"

namespace ckptd {

// Where a report's figures come from; every pointer must be set.
struct StatusSources {
  int rank = 0;
  int num_ranks = 1;
  std::string version{};
  std::string tcp_address{};
  std::string metrics_address{};
  absl::Time started{};
  int64_t root_free_bytes = -1;  // -1: unknown
  StepRegistry* registry = nullptr;
  const StorageTiers* tiers = nullptr;
  const StagingArea* staging = nullptr;
  const DeviceStager* device = nullptr;
  const Restorer* restorer = nullptr;
};

// This daemon's own status, without the other ranks'.
v1::StatusResponse LocalStatusReport(const StatusSources& from);

// The gauges of /metrics, from a local status report.
std::vector<Metrics::Gauge> StatusGauges(const v1::StatusResponse& now);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_SERVICE_STATUS_REPORT_H_
