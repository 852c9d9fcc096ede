#include <gtest/gtest.h>

#include "common/error.h"
#include "schedule/schedule.h"

using namespace pipetrain;
using namespace pipetrain::schedule;

TEST(GPipe, ValidForManyShapes) {
  for (int k = 1; k <= 8; ++k)
    for (int m = 1; m <= 32; ++m) {
      Schedule s = make_gpipe(k, m);
      EXPECT_NO_THROW(validate(s)) << k << " stages, " << m << " micro-batches";
      for (int r = 0; r < k; ++r) {
        const size_t comm = (r > 0 ? 2 : 0) + (r < k - 1 ? 2 : 0);
        EXPECT_EQ(s.actions[r].size(), static_cast<size_t>(m) * (2 + comm));
      }
    }
}

TEST(GPipe, FillDrainOrder) {
  Schedule s = make_gpipe(2, 3);
  EXPECT_EQ(s.actions[0][0], (Action{Op::Forward, 0}));
  EXPECT_EQ(s.actions[0][6], (Action{Op::RecvGrad, 2}));  // backward starts with the last micro-batch
  EXPECT_EQ(s.actions[1][0], (Action{Op::RecvActivation, 0}));
  EXPECT_EQ(s.actions[1].back(), (Action{Op::SendGrad, 0}));
}

TEST(Validate, RejectsMissingBackward) {
  Schedule s = make_gpipe(2, 2);
  auto& l = s.actions[0];
  l.erase(std::find(l.begin(), l.end(), Action{Op::Backward, 1}));
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, RejectsBackwardBeforeForward) {
  Schedule s = make_gpipe(1, 2);
  std::swap(s.actions[0][0], s.actions[0][3]);
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, RejectsForwardBeforeItsInputArrives) {
  Schedule s = make_gpipe(2, 1);
  std::swap(s.actions[1][0], s.actions[1][1]);  // forward before recv_activation
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(Validate, DetectsDeadlock) {
  // Stage 0 waits for a gradient before sending the activation stage 1 needs to produce it.
  Schedule s;
  s.kind = "bad";
  s.stages = 2;
  s.micro_batches = 1;
  s.actions = {{{Op::Forward, 0}, {Op::RecvGrad, 0}, {Op::SendActivation, 0}, {Op::Backward, 0}},
               {{Op::RecvActivation, 0}, {Op::Forward, 0}, {Op::Backward, 0}, {Op::SendGrad, 0}}};
  try {
    validate(s);
    FAIL();
  } catch (const ScheduleError& e) {
    EXPECT_NE(std::string(e.what()).find("deadlock"), std::string::npos) << e.what();
  }
}

TEST(Validate, RejectsCommunicationPastTheEnds) {
  Schedule s = make_gpipe(2, 1);
  s.actions[0].insert(s.actions[0].begin(), Action{Op::RecvActivation, 0});
  EXPECT_THROW(validate(s), ScheduleError);
}

TEST(MakeSchedule, UnknownKindAndSizes) {
  EXPECT_THROW(make_schedule("pipedream", 2, 2), ScheduleError);
  EXPECT_THROW(make_schedule("gpipe", 0, 2), ScheduleError);
  EXPECT_THROW(make_schedule("gpipe", 2, 0), ScheduleError);
}
