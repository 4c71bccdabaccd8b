// A data file of a step saved with parity (redundancy: parity) that no host can serve
// any more, read by decoding: each read of it reads the same byte range of K of the
// stripe's surviving chunks (the other members' data files and the holders' parity
// files) and rebuilds the range, so a restore reads only the stripes it needs. Made
// by PeerFileSystem when every holder of a data file has failed; its bytes are then
// checked, like any data file's, against the index's crc32c by the bundle reader, so
// a corrupt survivor yields DATA_LOSS, never wrong bytes. Reads are thread-safe when
// the sources' are.
#ifndef CKPTD_DAEMON_PEER_REBUILT_FILE_H_
#define CKPTD_DAEMON_PEER_REBUILT_FILE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/bundle/checkpoint_meta.h"
#include "daemon/io/file_system.h"

namespace ckptd {

// The files a rebuild may read, by position in the lost file's parity group (null:
// that member's file could not be opened).
struct ParitySources {
  std::vector<std::unique_ptr<RandomAccessFile>> data;
  std::vector<std::unique_ptr<RandomAccessFile>> parity;
};

// Saving rank `shard`'s data file, rebuilt from `sources` as `meta` (the step's
// ckptd.json, with parity) lays its group out. DATA_LOSS when some stripe of the file
// has fewer than K chunks left: the message names the group, the members whose files
// are gone (with their hosts) and the tensors with boxes in the file. `step` names the
// step in messages ("run 'r' step 3").
absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRebuiltFile(const CheckpointMeta& meta, int shard,
                                                                 ParitySources sources,
                                                                 const std::string& step);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_PEER_REBUILT_FILE_H_
