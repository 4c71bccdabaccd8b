// A gtest fixture owning one Cluster: started by the test with the ranks it needs,
// and at tear-down stopped by SIGTERM to one daemon, which must stop every rank
// cleanly (mpirun exits 0).
#ifndef CKPTD_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
#define CKPTD_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_

#include <gtest/gtest.h>

#include <memory>

#include "tests/integration/cluster.h"

namespace ckptd::testing {

class ClusterFixture : public ::testing::Test {
 protected:
  void StartCluster(int ranks) {
    cluster_ = std::make_unique<Cluster>(ranks);
    absl::Status s = cluster_->Start();
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_EQ(cluster_->Stop(), 0) << "see " << cluster_->log();
    }
  }
  std::unique_ptr<Cluster> cluster_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
