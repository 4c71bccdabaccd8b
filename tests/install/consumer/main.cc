// Saves a tensor through the daemon at argv[1], waits for its commit and restores it,
// using only the installed headers and library. Exit 0 when the bytes match.
#include <cstdio>
#include <vector>

#include "ckptd/client.h"
#include "ckptd/v1/wire.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SOCKET\n");
    return 2;
  }
  auto client = ckptd::Client::Connect(argv[1]);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  std::vector<float> saved(1000);
  for (size_t i = 0; i < saved.size(); ++i) saved[i] = static_cast<float>(i) * 0.5f;
  ckptd::TensorShard shard{.name = "w", .dtype = ckptd::kDtFloat, .shape = {10, 100}};
  shard.data = saved.data();
  shard.size = saved.size() * sizeof(float);
  auto staged = (*client)->Save("consumer", 1, 0, 1, {shard});
  absl::Status s = staged.ok() ? (*client)->Wait("consumer", 1) : staged.status();
  std::vector<float> restored(saved.size());
  ckptd::RestoreTarget target{.name = "w", .dtype = ckptd::kDtFloat, .shape = {10, 100}};
  target.data = restored.data();
  target.size = restored.size() * sizeof(float);
  if (s.ok()) s = (*client)->Restore("consumer", std::nullopt, {target}).status();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if (restored != saved) {
    std::fprintf(stderr, "restored bytes differ\n");
    return 1;
  }
  std::printf("consumer (ckptd %s): saved, committed and restored 4000 bytes\n", ckptd::wire::kVersion);
  return 0;
}
