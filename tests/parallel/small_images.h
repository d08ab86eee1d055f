// Small image data for the test suites that train the CNN.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

namespace tessel::testing {

// A folder of IDX files shaped like Fashion-MNIST's, 64 training and 32 test images of 28 x 28
// with pixels and labels from a fixed formula: the CNN's run evaluates its whole test set, and
// Fashion-MNIST's 10,000 images would take minutes through the portable convolution.
inline std::string small_images_dir() {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("tessel_small_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto be32 = [](std::ofstream& out, uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) out.put(static_cast<char>(v >> shift & 0xFF));
  };
  for (const auto& [split, n] : {std::pair{"train", 64u}, std::pair{"t10k", 32u}}) {
    std::ofstream images(dir / (std::string(split) + "-images-idx3-ubyte"), std::ios::binary);
    be32(images, 0x803);
    be32(images, n);
    be32(images, 28);
    be32(images, 28);
    for (uint32_t i = 0; i < n * 784; ++i)
      images.put(static_cast<char>((i * 37 + i / 784 * 11) % 251));
    std::ofstream labels(dir / (std::string(split) + "-labels-idx1-ubyte"), std::ios::binary);
    be32(labels, 0x801);
    be32(labels, n);
    for (uint32_t i = 0; i < n; ++i) labels.put(static_cast<char>(i % 10));
  }
  return dir.string();
}

}  // namespace tessel::testing
