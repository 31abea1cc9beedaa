// Progress lines and bars (worker/report/progress.h): steps, percentages and ETAs from their formulas.
#include "worker/report/progress.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

namespace ddp::worker {
namespace {

TEST(Progress, DurationsReadLikeAClock) {
  EXPECT_EQ(formatDuration(0), "0:00");
  EXPECT_EQ(formatDuration(7.4), "0:07");
  EXPECT_EQ(formatDuration(59.6), "1:00");
  EXPECT_EQ(formatDuration(12 * 60 + 3), "12:03");
  EXPECT_EQ(formatDuration(3600 + 2 * 60 + 3), "1:02:03");
  EXPECT_EQ(formatDuration(-1), "?");
  EXPECT_EQ(formatDuration(NAN), "?");
  EXPECT_EQ(formatDuration(INFINITY), "?");
}

TEST(Progress, StepsPerEpochAndJob) {
  // 60 000 images over 4 ranks, batch 32: 15 000 per rank, 469 batches (the last one short).
  EXPECT_EQ(stepsPerEpoch((15000 + 31) / 32, 1), 469);
  EXPECT_EQ(stepsPerEpoch(469, 4), 118);  // ceil(469 / 4): the last step takes one micro-batch
  EXPECT_EQ(totalSteps(2, 469, 0), 938);
  EXPECT_EQ(totalSteps(2, 469, 100), 100);
  EXPECT_EQ(totalSteps(1, 469, 10000), 469);
}

ProgressPoint point() {
  ProgressPoint p;
  p.step = 450 + 469;  // epoch 2 of 2, step 450 of 469 in it
  p.totalSteps = 938;
  p.epoch = 1;
  p.epochs = 2;
  p.epochStep = 450;
  p.epochSteps = 469;
  p.loss = 0.44281;
  p.samplesPerS = 5308.4;
  p.elapsedS = 91.9;
  p.runSteps = 919;  // 0.1 s per step
  return p;
}

TEST(Progress, LineHasStepPercentLossRateElapsedAndEtas) {
  // ETA epoch: 19 steps × 0.1 s = 1.9 s; job: 19 steps left as well; 919/938 = 97.97 %.
  EXPECT_EQ(progressLine(point()),
            "epoch 2/2 step 919/938 (98%) loss 0.4428 5308 samples/s elapsed 1:32 ETA epoch 0:02 job 0:02");
  // A resumed run: only this process's steps set the pace (100 steps in 50 s = 0.5 s per step).
  // Epoch: 169 steps × 0.5 s = 84.5 s → 1:25; job: 638 × 0.5 = 319 s → 5:19; 300/938 = 32 %.
  ProgressPoint resumed = point();
  resumed.step = 300;
  resumed.epoch = 0;
  resumed.epochStep = 300;
  resumed.runSteps = 100;
  resumed.elapsedS = 50;
  EXPECT_EQ(progressLine(resumed),
            "epoch 1/2 step 300/938 (32%) loss 0.4428 5308 samples/s elapsed 0:50 ETA epoch 1:25 job 5:19");
  // train.max_steps ends the job inside the epoch: the epoch's ETA is the job's (10 steps × 0.5 s).
  ProgressPoint capped = resumed;
  capped.totalSteps = 310;
  EXPECT_NE(progressLine(capped).find("ETA epoch 0:05 job 0:05"), std::string::npos) << progressLine(capped);
  // Before any step of this run the pace is unknown.
  ProgressPoint first = point();
  first.runSteps = 0;
  EXPECT_NE(progressLine(first).find("ETA epoch ? job ?"), std::string::npos);
}

TEST(Progress, BarFillsInProportion) {
  ProgressPoint p = point();
  p.step = 469;  // half of 938
  EXPECT_EQ(progressBar(p, 10).substr(0, 17), "[#####.....]  50%");
  p.step = 938;
  EXPECT_EQ(progressBar(p, 10).substr(0, 17), "[##########] 100%");
  p.step = 0;
  EXPECT_EQ(progressBar(p, 10).substr(0, 17), "[..........]   0%");
}

TEST(Progress, BarIsDrawnInPlaceAndClearedOnlyWhenShown) {
  for (const bool relayed : {false, true}) {
    char* text = nullptr;
    std::size_t size = 0;
    std::FILE* out = ::open_memstream(&text, &size);
    {
      ProgressBar bar(true, relayed, out);
      bar.clear();  // nothing shown yet: nothing written
      bar.update(point());
      bar.clear();
    }
    std::fclose(out);
    const std::string written(text, size);
    std::free(text);
    const std::string drawn = progressBar(point(), 30);
    EXPECT_EQ(written, relayed ? drawn + "\r" : "\r" + drawn + "\033[K" + "\r\033[K");
  }
  char* text = nullptr;
  std::size_t size = 0;
  std::FILE* out = ::open_memstream(&text, &size);
  {
    ProgressBar off(false, false, out);
    off.update(point());
  }
  std::fclose(out);
  EXPECT_EQ(size, 0u);
  std::free(text);
}

}  // namespace
}  // namespace ddp::worker
