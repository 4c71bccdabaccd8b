// "Did you mean": the known word closest to a misspelt one. Pure functions; any thread.
#ifndef CKPTD_DAEMON_BASE_CLOSEST_WORD_H_
#define CKPTD_DAEMON_BASE_CLOSEST_WORD_H_

#include <optional>
#include <string>
#include <vector>

namespace ckptd {

// The candidate with the fewest single-character edits from `word`, if it is close
// enough to be a typo of it (at most a third of the word's length, at least 2 edits
// allowed); nullopt otherwise.
std::optional<std::string> ClosestWord(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace ckptd

#endif  // CKPTD_DAEMON_BASE_CLOSEST_WORD_H_
