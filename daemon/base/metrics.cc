#include "daemon/base/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckptd {
namespace {

const std::vector<double> kSecondsBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                             1,     2.5,   5,    10,    30,   60,  120,  300};

// Label values escaped as the text format wants: backslash, double quote, newline.
std::string Escape(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string RenderLabels(const Metrics::Labels& labels) {
  std::string out;
  for (const auto& [key, value] : labels) {
    absl::StrAppend(&out, out.empty() ? "" : ",", key, "=\"", Escape(value), "\"");
  }
  return out;
}

std::string Number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.9g", v);
}

std::string WithLabels(const std::string& labels, const std::string& extra = "") {
  if (labels.empty() && extra.empty()) return "";
  return absl::StrCat("{", labels, labels.empty() || extra.empty() ? "" : ",", extra, "}");
}

}  // namespace

Metrics::Metrics()
    : families_({
          {"ckptd_saves_total", {"counter", "Trainer saves staged, by run.", {}}},
          {"ckptd_save_failures_total", {"counter", "Saves refused or broken off, by gRPC status code.", {}}},
          {"ckptd_staged_bytes_total", {"counter", "Bytes trainers staged, by run.", {}}},
          {"ckptd_save_staging_seconds",
           {"histogram", "Time from a Save's first message to its bytes in daemon memory.", kSecondsBuckets}},
          {"ckptd_restores_total", {"counter", "Restores served, by run.", {}}},
          {"ckptd_restore_failures_total", {"counter", "Restores that failed, by gRPC status code.", {}}},
          {"ckptd_restore_bytes_delivered_total",
           {"counter", "Bytes restores delivered to trainers, by run.", {}}},
          {"ckptd_restore_storage_bytes_read_total",
           {"counter", "Bytes of data files restores read from storage here, by run.", {}}},
          {"ckptd_restore_seconds", {"histogram", "Time a restore took, by run.", kSecondsBuckets}},
          {"ckptd_commits_total", {"counter", "Steps committed, by run.", {}}},
          {"ckptd_step_failures_total", {"counter", "Steps that failed, by run and gRPC status code.", {}}},
          {"ckptd_commit_seconds",
           {"histogram",
            "A committed step's commit time, by run: from the start of its commit round (every trainer "
            "staged) until every shard was durable and the index merged, as rank 0 measured it.",
            kSecondsBuckets}},
          {"ckptd_commit_phase_seconds",
           {"histogram", "Time of each commit phase (this rank's part and the vote), by phase.",
            kSecondsBuckets}},
          {"ckptd_bytes_written_total", {"counter", "Bytes of data files this daemon wrote, by run.", {}}},
      }) {}

void Metrics::Count(const std::string& name, const Labels& labels, double by) {
  absl::MutexLock lock(&mu_);
  series_[name][RenderLabels(labels)].value += by;
}

void Metrics::Observe(const std::string& name, const Labels& labels, double value) {
  const auto family = families_.find(name);
  if (family == families_.end()) return;
  absl::MutexLock lock(&mu_);
  Series& s = series_[name][RenderLabels(labels)];
  s.counts.resize(family->second.buckets.size());
  for (size_t i = 0; i < family->second.buckets.size(); ++i) {
    if (value <= family->second.buckets[i]) {
      ++s.counts[i];
      break;
    }
  }
  ++s.count;
  s.sum += value;
}

std::string Metrics::Render(const std::vector<Gauge>& gauges) const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) {
    absl::StrAppend(&out, "# HELP ", name, " ", family.help, "\n# TYPE ", name, " ", family.type, "\n");
    const auto found = series_.find(name);
    if (found == series_.end()) {
      // A counter with no labels yet reads 0; labelled families show up when used.
      continue;
    }
    for (const auto& [labels, s] : found->second) {
      if (family.type == "counter") {
        absl::StrAppend(&out, name, WithLabels(labels), " ", Number(s.value), "\n");
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < family.buckets.size(); ++i) {
        cumulative += i < s.counts.size() ? s.counts[i] : 0;
        absl::StrAppend(&out, name, "_bucket",
                        WithLabels(labels, absl::StrCat("le=\"", Number(family.buckets[i]), "\"")), " ",
                        cumulative, "\n");
      }
      absl::StrAppend(&out, name, "_bucket", WithLabels(labels, "le=\"+Inf\""), " ", s.count, "\n");
      absl::StrAppend(&out, name, "_sum", WithLabels(labels), " ", Number(s.sum), "\n");
      absl::StrAppend(&out, name, "_count", WithLabels(labels), " ", s.count, "\n");
    }
  }
  const std::string* previous = nullptr;
  for (const Gauge& g : gauges) {
    if (previous == nullptr || *previous != g.name) {
      absl::StrAppend(&out, "# HELP ", g.name, " ", g.help, "\n# TYPE ", g.name, " gauge\n");
    }
    previous = &g.name;
    absl::StrAppend(&out, g.name, WithLabels(RenderLabels(g.labels)), " ", Number(g.value), "\n");
  }
  return out;
}

}  // namespace ckptd
