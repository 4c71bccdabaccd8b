// Metrics: the daemon's counters and histograms, rendered in the Prometheus text
// exposition format (version 0.0.4) for the /metrics endpoint. One instance per
// daemon, owned by main; the service and the coordinator record into it from their
// own threads (every method is thread-safe). Families are fixed here, with their help
// text and buckets, so that a scrape always shows every family, zero or not.
#ifndef CKPTD_DAEMON_BASE_METRICS_H_
#define CKPTD_DAEMON_BASE_METRICS_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckptd {

class Metrics {
 public:
  using Labels = std::vector<std::pair<std::string, std::string>>;

  Metrics();

  // Adds `by` to counter `name` (a family below) with `labels`.
  void Count(const std::string& name, const Labels& labels, double by = 1);
  // Records one observation of histogram `name`.
  void Observe(const std::string& name, const Labels& labels, double value);

  // A value known only at scrape time (staged bytes now, say).
  struct Gauge {
    std::string name;
    std::string help;
    double value = 0;
    Labels labels{};
  };
  // Every family in the text format, then `gauges` (a name's HELP and TYPE once, before
  // the first of its consecutive gauges).
  std::string Render(const std::vector<Gauge>& gauges = {}) const;

 private:
  struct Family {
    std::string type;  // "counter" or "histogram"
    std::string help;
    std::vector<double> buckets;  // histograms: upper bounds, ascending
  };
  struct Series {
    double value = 0;              // counters
    std::vector<uint64_t> counts;  // histograms: per bucket (not cumulative)
    uint64_t count = 0;
    double sum = 0;
  };
  const std::map<std::string, Family> families_;
  mutable absl::Mutex mu_;
  // family -> rendered label set ("run=\"a\",code=\"X\"") -> series
  std::map<std::string, std::map<std::string, Series>> series_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_METRICS_H_
