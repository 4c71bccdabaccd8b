// A fresh temporary directory for one test, removed with everything in it afterwards.
#ifndef CKPTD_TESTS_COMMON_TEMP_DIR_H_
#define CKPTD_TESTS_COMMON_TEMP_DIR_H_

#include <stdlib.h>

#include <string>

#include "daemon/io/file_system.h"

namespace ckptd::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/ckptd-test-XXXXXX";
    path_ = mkdtemp(pattern.data()) == nullptr ? "" : pattern;
  }
  ~TempDir() { PosixFileSystem()->DeleteRecursively(path_).IgnoreError(); }
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return JoinPath(path_, name); }

 private:
  std::string path_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_COMMON_TEMP_DIR_H_
