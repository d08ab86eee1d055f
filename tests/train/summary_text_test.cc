// The console summary rounds as `tessel report` does; summary.json keeps every digit.
#include "tessel/train/summary_text.h"

#include <gtest/gtest.h>

namespace tessel::train {
namespace {

using nlohmann::json;

TEST(SummaryText, RoundsAsTheReport) {
  EXPECT_EQ(shown("test_accuracy", 0.876543210), "87.65%");
  EXPECT_EQ(shown("train_seconds", 12.3456789), "12.3 s");
  EXPECT_EQ(shown("peak_rss_bytes", 123456789), "117.7 MiB");
  EXPECT_EQ(shown("peak_rss_bytes_per_rank", json::array({1048576, 3145728})),
            "[1.0 MiB, 3.0 MiB]");
  EXPECT_EQ(shown("train_loss", 0.123456789), "0.1235");
  EXPECT_EQ(shown("samples_per_second", 12345.678), "12,346");
  EXPECT_EQ(shown("num_parameters", 1234567), "1,234,567");
  EXPECT_EQ(shown("epochs", 3), "3");
  EXPECT_EQ(shown("model", "mlp"), "mlp");
  EXPECT_EQ(shown("completed", true), "true");
  EXPECT_EQ(shown("test_loss", nullptr), "null");
  EXPECT_EQ(shown("straggler", json{{"rank", 1}, {"slowdown", 1.23456}}),
            "{rank: 1, slowdown: 1.235}");
}

TEST(SummaryText, NoFullPrecisionNumberReachesTheConsole) {
  const json s = {{"run_dir", "runs/x"},
                  {"train_loss", 0.31415926535},
                  {"test_accuracy", 0.8812345678},
                  {"wall_seconds", 7.654321},
                  {"ranks", {{"load_balance_max_over_mean", 1.0123456}, {"slowest_rank", 1}}}};
  const std::string text = summary_text(s);
  EXPECT_NE(text.find("== summary (runs/x/summary.json) =="), std::string::npos) << text;
  EXPECT_NE(text.find("train_loss           0.3142\n"), std::string::npos) << text;
  EXPECT_NE(text.find("test_accuracy        88.12%\n"), std::string::npos) << text;
  EXPECT_NE(text.find("wall_seconds         7.7 s\n"), std::string::npos) << text;
  EXPECT_NE(text.find("load balance (max/mean step time) 1.012, slowest rank 1"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("3141"), std::string::npos) << text;
}

}  // namespace
}  // namespace tessel::train
