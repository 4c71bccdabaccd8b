// libFuzzer harness: DTensor layout and mesh strings, as a client sends them. Whatever
// the bytes, parsing returns a Status; a parsed layout prints back to itself and maps
// every device to a box inside the shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "daemon/layout/mesh.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ckptd::ParseMesh(text).IgnoreError();
  auto layout = ckptd::ParseLayout(text);
  if (!layout.ok()) return 0;
  auto again = ckptd::ParseLayout(layout->ToString());
  if (!again.ok() || again->ToString() != layout->ToString()) std::abort();
  ckptd::Shape shape;
  for (size_t d = 0; d < layout->sharding_specs.size(); ++d)
    shape.push_back(static_cast<int64_t>(12 * (d + 1)));
  for (size_t i = 0; i < layout->mesh.global_device_ids.size() && i < 64; ++i) {
    auto box = layout->BoxFor(shape, layout->mesh.global_device_ids[i]);
    if (box.ok() && !ckptd::CheckBoxInShape(*box, shape).ok()) std::abort();
  }
  return 0;
}
