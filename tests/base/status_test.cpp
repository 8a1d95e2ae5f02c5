#include "base/status.h"

#include <gtest/gtest.h>

namespace kvasir {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Error("{} is odd", x);
  return x / 2;
}

Result<int> Quarter(int x) {
  KV_ASSIGN_OR_RETURN(int h, Half(x));
  KV_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Error("file {}: bad", "x.gguf");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "file x.gguf: bad");
  EXPECT_EQ(s.WithContext("load").message(), "load: file x.gguf: bad");
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "3 is odd");
}

}  // namespace
}  // namespace kvasir
