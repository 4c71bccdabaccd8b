#include "daemon/base/closest_word.h"

#include <algorithm>

namespace ckptd {
namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::optional<std::string> ClosestWord(const std::string& word, const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace ckptd
