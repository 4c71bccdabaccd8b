#include "daemon/service/validation.h"

#include <gtest/gtest.h>

namespace ckptd {
namespace {

v1::SaveHeader GoodHeader() {
  v1::SaveHeader h;
  h.set_run("run-1");
  h.set_step(7);
  h.set_trainer_id(0);
  h.set_trainer_count(2);
  v1::TensorDescriptor* t = h.add_tensors();
  t->set_name("w");
  t->set_dtype(1);
  t->add_shape(4);
  t->add_shape(2);
  t->mutable_box()->add_start(0);
  t->mutable_box()->add_start(0);
  t->mutable_box()->add_length(2);
  t->mutable_box()->add_length(2);
  return h;
}

void ExpectInvalid(const v1::SaveHeader& h, const std::string& field) {
  std::vector<CheckedTensor> out;
  absl::Status s = ValidateSaveHeader(h, Placement{}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(field), absl::string_view::npos) << s;
}

TEST(ValidationTest, GoodHeader) {
  std::vector<CheckedTensor> out;
  ASSERT_TRUE(ValidateSaveHeader(GoodHeader(), Placement{}, &out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].bytes, 16);
}

TEST(ValidationTest, RunNames) {
  EXPECT_TRUE(ValidateRunName("a.b_c-1").ok());
  EXPECT_TRUE(ValidateRunName("0..9").ok());  // dots inside are harmless: no '/' can follow
  EXPECT_TRUE(ValidateRunName(std::string(128, 'r')).ok());
  // Path traversal and friends.
  for (const std::string& bad :
       {std::string(""), std::string("a/b"), std::string(".."), std::string("."), std::string("../etc"),
        std::string("a/../../b"), std::string("/etc/passwd"), std::string(".hidden"), std::string("-rf"),
        std::string("_x"), std::string("a\\b"), std::string("a b"), std::string("caf\xc3\xa9"),
        std::string("x\0y", 3), std::string("line\nbreak"), std::string(129, 'r')}) {
    EXPECT_EQ(ValidateRunName(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(ValidationTest, BadTensors) {
  v1::SaveHeader h = GoodHeader();
  h.mutable_tensors(0)->set_shape(0, -4);
  ExpectInvalid(h, "tensors[0].shape");

  h = GoodHeader();
  h.mutable_tensors(0)->set_dtype(7);  // string
  ExpectInvalid(h, "tensors[0].dtype");
  h.mutable_tensors(0)->set_dtype(99);
  ExpectInvalid(h, "tensors[0].dtype");

  h = GoodHeader();
  h.mutable_tensors(0)->mutable_box()->set_start(0, 3);
  ExpectInvalid(h, "tensors[0].box");

  h = GoodHeader();
  *h.add_tensors() = h.tensors(0);
  ExpectInvalid(h, "tensors[1].name");

  h = GoodHeader();
  h.set_trainer_id(2);
  ExpectInvalid(h, "trainer_id");

  h = GoodHeader();
  h.set_run("../etc");
  ExpectInvalid(h, "run");

  h = GoodHeader();
  h.set_step(-1);
  ExpectInvalid(h, "step");
}

}  // namespace
}  // namespace ckptd
