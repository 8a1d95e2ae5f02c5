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

TEST(StatusTest, CodesSurviveContext) {
  EXPECT_EQ(Status::Ok().code(), StatusCode::kOk);
  EXPECT_EQ(Error("plain").code(), StatusCode::kInvalidInput);
  Status eof = Error(StatusCode::kEndOfStream, "{}: peer closed", "link");
  EXPECT_EQ(eof.code(), StatusCode::kEndOfStream);
  EXPECT_EQ(eof.WithContext("stage").code(), StatusCode::kEndOfStream);
  EXPECT_EQ(eof.WithContext("stage").message(), "stage: link: peer closed");
  EXPECT_EQ(eof.WithCode(StatusCode::kTimeout).code(), StatusCode::kTimeout);
  // kOk is not an error code: an "error" built with it still fails.
  EXPECT_FALSE(Status::Error("x", StatusCode::kOk).ok());
  Result<int> r = Error(StatusCode::kTooLarge, "big");
  EXPECT_EQ(r.status().code(), StatusCode::kTooLarge);
  EXPECT_STREQ(StatusCodeName(StatusCode::kUnauthenticated), "unauthenticated");
}

}  // namespace
}  // namespace kvasir
