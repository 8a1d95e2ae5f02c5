// LinkSet (ring/link_set.h): what stopping a stage's link parts relies on.
#include "ring/link_set.h"

#include <gtest/gtest.h>

#include "net/stream.h"

namespace kvasir::ring {
namespace {

// A link over a loopback connection, and the accepted end it talks to.
struct Connected {
  std::unique_ptr<net::Stream> far;
  std::shared_ptr<Link> link;
};

Connected Connect(net::Listener& listener) {
  Connected c;
  auto near = net::DialTcp("127.0.0.1", listener.port(), 2000);
  EXPECT_TRUE(near.ok()) << near.status().message();
  auto far = listener.Accept();
  EXPECT_TRUE(far.ok()) << far.status().message();
  c.far = std::move(far).value();
  c.link = std::make_shared<Link>(std::move(near).value(), "test link");
  return c;
}

TEST(LinkSetTest, ClosesEveryLinkStillOpenAndRefusesLaterOnes) {
  auto listener = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().message();
  LinkSet set;
  Connected a = Connect(*listener);
  Connected b = Connect(*listener);
  ASSERT_TRUE(set.Add(a.link));
  ASSERT_TRUE(set.Add(b.link));
  // A link that ended is not kept alive by the set.
  std::weak_ptr<Link> gone = b.link;
  b.link.reset();
  EXPECT_TRUE(gone.expired());
  set.CloseAll();
  EXPECT_TRUE(a.link->closed());
  // Once closed, a link opened late is refused (its owner drops it), and closing again is safe.
  Connected late = Connect(*listener);
  EXPECT_FALSE(set.Add(late.link));
  EXPECT_FALSE(late.link->closed());
  set.CloseAll();
  EXPECT_FALSE(late.link->closed());
}

}  // namespace
}  // namespace kvasir::ring
