// Reuse-or-fetch of a window's slice (node::EnsureSlice), against a tiny model served over HTTP
// by a server that counts requests: a verified slice costs nothing, a wrong one is fetched again.
#include "node/slice_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/sha256.h"
#include "fake_http_server.h"
#include "gguf/gguf_file.h"
#include "model/model_id.h"
#include "test_assets.h"
#include "tiny_model.h"

namespace kvasir::node {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

class SliceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::TinyModelShape shape;
    shape.n_layer = 3;
    ASSERT_TRUE(testing::WriteTinyModel(dir_.File("tiny.gguf"), shape).ok());
    model_ = testing::ReadFileToString(dir_.File("tiny.gguf"));
    auto parent = GgufFile::Open(dir_.File("tiny.gguf"));
    ASSERT_TRUE(parent.ok()) << parent.status().message();
    model_id_ = ModelIdHex(ComputeModelId(parent->header(), "tiny").value());
    for (const auto& t : parent->tensors()) {
      if (t.name.rfind("blk.1.", 0) == 0)
        sha256_[t.name] = Sha256Hex(Sha256Of(parent->TensorData(t)));
    }
  }

  // Layers 1:2 of the served model into DIR/cache/tiny.layers-1-2.gguf, as a joiner asks for it:
  // identity and digests known beforehand.
  FetchOptions Options() const {
    FetchOptions o;
    o.url = server_.Url("/tiny.gguf");
    o.first = 1;
    o.last = 2;
    o.out_path = SlicePathFor(dir_.File("cache"), o.url, 1, 2);
    o.expected_model_id = model_id_;
    o.sha256 = sha256_;
    o.http.connect_timeout_ms = 3000;
    o.http.request_timeout_ms = 3000;
    o.retry.delay_ms = 20;
    o.retry.retries = 1;
    return o;
  }

  TempDir dir_;
  std::string model_, model_id_;
  std::map<std::string, std::string> sha256_;
  testing::FakeHttpServer server_{[this](const testing::FakeRequest& r) {
    return testing::FakeHttpServer::Partial(r, model_);
  }};
};

TEST_F(SliceCacheTest, SlicePathIsNamedAfterTheUrlAndWindow) {
  EXPECT_EQ(SlicePathFor("/c", "http://h/m/qwen.gguf?x=1", 3, 7), "/c/qwen.layers-3-7.gguf");
  EXPECT_EQ(SlicePathFor("/c", "not a url", 0, 1), "/c/model.layers-0-1.gguf");
}

TEST_F(SliceCacheTest, AVerifiedSliceIsReusedWithoutARequest) {
  const FetchOptions o = Options();
  Status s = EnsureSlice(o);
  ASSERT_TRUE(s.ok()) << s.message();
  const int fetched = server_.requests();
  EXPECT_GT(fetched, 0);
  EXPECT_TRUE(VerifySlice(o.out_path, model_id_, 1, 2, sha256_).ok());

  s = EnsureSlice(o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(server_.requests(), fetched);
}

TEST_F(SliceCacheTest, ASliceWithAWrongDigestIsFetchedAgain) {
  const FetchOptions o = Options();
  ASSERT_TRUE(EnsureSlice(o).ok());
  const int fetched = server_.requests();
  const std::string good = testing::ReadFileToString(o.out_path);
  // One byte of the last tensor's data changed: same size, same header, wrong SHA-256.
  {
    std::fstream f(o.out_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(good.size() - 1));
    f.put(static_cast<char>(good.back() ^ 0x5a));
  }
  ASSERT_FALSE(VerifySlice(o.out_path, model_id_, 1, 2, sha256_).ok());

  Status s = EnsureSlice(o);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GT(server_.requests(), fetched);
  EXPECT_EQ(testing::ReadFileToString(o.out_path), good);
}

TEST_F(SliceCacheTest, ASliceOfAnotherModelIsFetchedAgain) {
  FetchOptions o = Options();
  ASSERT_TRUE(EnsureSlice(o).ok());
  const int fetched = server_.requests();
  // The file kept there is a verified slice, but the market now names another model: the slice
  // is not reused, and the fetch itself refuses the served file for it.
  o.expected_model_id = std::string(32, '0');
  o.sha256.clear();
  Status s = EnsureSlice(o);
  EXPECT_GT(server_.requests(), fetched);
  EXPECT_THAT(s.message(), HasSubstr("0000"));
}

TEST_F(SliceCacheTest, OfflineALocalSliceOfTheRightWindowIsUsed) {
  FetchOptions o = Options();
  ASSERT_TRUE(EnsureSlice(o).ok());
  // No identity given and nothing listening: the local slice of that window is all there is.
  o.expected_model_id.reset();
  o.sha256.clear();
  o.url = "http://127.0.0.1:1/tiny.gguf";
  EXPECT_TRUE(EnsureSlice(o).ok());
  o.first = 0;
  EXPECT_FALSE(EnsureSlice(o).ok());
}

}  // namespace
}  // namespace kvasir::node
