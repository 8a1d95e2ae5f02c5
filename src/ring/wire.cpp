// Names for the enums of wire.h, for logs and error messages.
#include "ring/wire.h"

namespace kvasir::wire {

const char* MsgTypeName(uint16_t type) {
  switch (type) {
    case 1:
      return "HELLO";
    case 2:
      return "ERROR";
    case 3:
      return "GENERATE";
    case 4:
      return "OPEN_SESSION";
    case 5:
      return "HIDDEN";
    case 6:
      return "TOKEN";
    case 7:
      return "CLOSE_SESSION";
    case 8:
      return "PING";
    case 9:
      return "PONG";
    case 10:
      return "STATS";
    case 11:
      return "HANDSHAKE";
    case 12:
      return "KEEPALIVE";
    case 13:
      return "RECEIPT";
    default:
      return "UNKNOWN";
  }
}

const char* FinishReasonName(uint8_t reason) {
  switch (reason) {
    case 0:
      return "none";
    case 1:
      return "eog";
    case 2:
      return "max_tokens";
    case 3:
      return "stop_string";
    case 4:
      return "context_full";
    case 5:
      return "error";
    case 6:
      return "client_closed";
    default:
      return "unknown";
  }
}

}  // namespace kvasir::wire
