// The /metrics text: families with help and type, labels escaped, histogram buckets
// cumulative with +Inf, _sum and _count, gauges after.
#include "daemon/base/metrics.h"

#include <gtest/gtest.h>

#include <thread>

namespace ckptd {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, CountersByLabelAndEscapedValues) {
  Metrics m;
  m.Count("ckptd_saves_total", {{"run", "a"}});
  m.Count("ckptd_saves_total", {{"run", "a"}}, 2);
  m.Count("ckptd_saves_total", {{"run", "q\"b\\"}});
  m.Count("ckptd_staged_bytes_total", {{"run", "a"}}, 1e12);
  const std::string text = m.Render();
  EXPECT_TRUE(Has(text, "# HELP ckptd_saves_total Trainer saves staged, by run.")) << text;
  EXPECT_TRUE(Has(text, "# TYPE ckptd_saves_total counter")) << text;
  EXPECT_TRUE(Has(text, "ckptd_saves_total{run=\"a\"} 3")) << text;
  EXPECT_TRUE(Has(text, "ckptd_saves_total{run=\"q\\\"b\\\\\"} 1")) << text;
  EXPECT_TRUE(Has(text, "ckptd_staged_bytes_total{run=\"a\"} 1000000000000")) << text;
  // Every family is described even before it has a value.
  EXPECT_TRUE(Has(text, "# TYPE ckptd_commit_phase_seconds histogram")) << text;
}

TEST(MetricsTest, HistogramsAreCumulativeWithInfSumAndCount) {
  Metrics m;
  for (double v : {0.003, 0.003, 0.7, 400.0}) m.Observe("ckptd_commit_seconds", {{"run", "r"}}, v);
  const std::string text = m.Render({{"ckptd_staged_bytes", "Bytes staged now.", 42}});
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_bucket{run=\"r\",le=\"0.001\"} 0")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_bucket{run=\"r\",le=\"0.005\"} 2")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_bucket{run=\"r\",le=\"1\"} 3")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_bucket{run=\"r\",le=\"300\"} 3")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_bucket{run=\"r\",le=\"+Inf\"} 4")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_sum{run=\"r\"} 400.706")) << text;
  EXPECT_TRUE(Has(text, "ckptd_commit_seconds_count{run=\"r\"} 4")) << text;
  EXPECT_TRUE(Has(text, "# TYPE ckptd_staged_bytes gauge")) << text;
  EXPECT_TRUE(Has(text, "ckptd_staged_bytes 42")) << text;
  // Observations without labels.
  m.Observe("ckptd_save_staging_seconds", {}, 0.02);
  EXPECT_TRUE(Has(m.Render(), "ckptd_save_staging_seconds_bucket{le=\"0.025\"} 1"));
  EXPECT_TRUE(Has(m.Render(), "ckptd_save_staging_seconds_count 1"));
}

TEST(MetricsTest, ConcurrentCountsAllLand) {
  Metrics m;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&m] {
      for (int i = 0; i < 1000; ++i) m.Count("ckptd_commits_total", {{"run", "x"}});
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(Has(m.Render(), "ckptd_commits_total{run=\"x\"} 4000"));
}

}  // namespace
}  // namespace ckptd
