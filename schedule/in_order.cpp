// validate_in_order() (in_order.h).
#include "schedule/in_order.h"

#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"

namespace pipetrain::schedule {

namespace {

// A message as its receiver names it: (kind: the receive's op, micro-batch, chunk there).
using Message = std::tuple<int, int, int>;

std::string describe(const Message& m) {
  const auto [op, mb, chunk] = m;
  return detail::concat(static_cast<Op>(op) == Op::RecvActivation ? "the activation" : "the gradient", " of micro-batch ", mb,
                        chunk ? detail::concat(" for chunk ", chunk) : "");
}

}  // namespace

void validate_in_order(const Schedule& s) {
  // Per ordered pair (from, to): the messages in the order `from` sends them, and in the order
  // `to` receives them.
  std::map<std::pair<int, int>, std::vector<Message>> sent, received;
  for (int r = 0; r < s.stages; ++r)
    for (const Action& a : s.actions[r]) {
      if (a.op == Op::Reduce) continue;
      const int vs = s.virtual_stage(r, a.chunk);
      switch (a.op) {
        case Op::SendActivation: {
          const int to = s.device_of(vs + 1);
          if (to != r) sent[{r, to}].emplace_back(static_cast<int>(Op::RecvActivation), a.micro_batch, s.chunk_of(vs + 1));
          break;
        }
        case Op::SendGrad: {
          const int to = s.device_of(vs - 1);
          if (to != r) sent[{r, to}].emplace_back(static_cast<int>(Op::RecvGrad), a.micro_batch, s.chunk_of(vs - 1));
          break;
        }
        case Op::RecvActivation: {
          const int from = s.device_of(vs - 1);
          if (from != r) received[{from, r}].emplace_back(static_cast<int>(Op::RecvActivation), a.micro_batch, a.chunk);
          break;
        }
        case Op::RecvGrad: {
          const int from = s.device_of(vs + 1);
          if (from != r) received[{from, r}].emplace_back(static_cast<int>(Op::RecvGrad), a.micro_batch, a.chunk);
          break;
        }
        default:
          break;
      }
    }
  for (const auto& [pair, out] : sent) {
    const auto& in = received[pair];
    const size_t n = std::min(out.size(), in.size());
    for (size_t k = 0; k < n; ++k)
      if (out[k] != in[k])
        throw ScheduleError(detail::concat("schedule ", name(s.kind), ": under in-order delivery stage ", pair.second,
                                           "'s receive #", k + 1, " from stage ", pair.first, " is ", describe(in[k]),
                                           ", but stage ", pair.first, "'s send #", k + 1, " to it is ", describe(out[k])));
    if (out.size() != in.size())
      throw ScheduleError(detail::concat("schedule ", name(s.kind), ": stage ", pair.first, " sends ", out.size(),
                                         " messages to stage ", pair.second, ", which receives ", in.size()));
  }
  for (const auto& [pair, in] : received)
    if (!sent.count(pair) && !in.empty())
      throw ScheduleError(detail::concat("schedule ", name(s.kind), ": stage ", pair.second, " receives ", in.size(),
                                         " messages from stage ", pair.first, ", which sends none"));
}

}  // namespace pipetrain::schedule
