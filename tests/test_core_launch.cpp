// CPU tests of the host launch helpers: the dtype dispatch (core/dtype_dispatch.h), the
// launch attributes (core/kernel_launch.h) and the device caches without a device.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>

#include "core/device.h"
#include "core/dtype_dispatch.h"
#include "core/kernel_launch.h"
#include "moekit/error.h"
#include "support/gpu.h"

namespace moekit {
namespace {

using detail::TypeTag;

// sizeof(in) * 10 + sizeof(out), or -1 for a type pair the dispatch must never produce.
template <class In, class Out>
int pair_code() {
  constexpr bool half_in = std::is_same_v<In, __nv_bfloat16> || std::is_same_v<In, __half>;
  constexpr bool ok = (half_in || std::is_same_v<In, float>)&&(std::is_same_v<Out, In> ||
                                                               std::is_same_v<Out, float>);
  return ok ? static_cast<int>(sizeof(In) * 10 + sizeof(Out)) : -1;
}

int dispatched(DType in, DType out) {
  return detail::dispatch_in_out<true>(in, out, "op", [](auto in_type, auto out_type) {
    return pair_code<typename decltype(in_type)::type, typename decltype(out_type)::type>();
  });
}

TEST(DtypeDispatch, PicksTheElementTypes) {
  EXPECT_EQ(dispatched(DType::kBF16, DType::kBF16), 22);
  EXPECT_EQ(dispatched(DType::kBF16, DType::kF32), 24);
  EXPECT_EQ(dispatched(DType::kF16, DType::kF16), 22);
  EXPECT_EQ(dispatched(DType::kF16, DType::kF32), 24);
  EXPECT_EQ(dispatched(DType::kF32, DType::kF32), 44);
  EXPECT_EQ(dispatched(DType::kF32, DType::kBF16), 44);  // f32 input: f32 output
  EXPECT_TRUE((detail::dispatch_float(DType::kBF16, "op", [](auto t) {
    return std::is_same_v<typename decltype(t)::type, __nv_bfloat16>;
  })));
  EXPECT_TRUE((detail::dispatch_float(DType::kF16, "op", [](auto t) {
    return std::is_same_v<typename decltype(t)::type, __half>;
  })));
}

TEST(DtypeDispatch, RejectsOtherDtypesNamingTheOp) {
  const auto half_only = [](DType d) {
    detail::dispatch_in_out(d, d, "some_op", [](auto, auto) {});
  };
  for (DType d : {DType::kF32, DType::kI32, DType::kFP8E4M3, DType::kI64}) {
    try {
      half_only(d);
      ADD_FAILURE() << "no error for " << dtype_name(d);
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()),
                std::string("moekit::some_op: unsupported dtype ") + dtype_name(d));
    }
  }
  EXPECT_THROW(dispatched(DType::kI32, DType::kF32), Error);
}

TEST(LaunchConfig, CarriesTheAttributesInTheOrderAsked) {
  detail::LaunchConfig launch(dim3(6, 2), dim3(128), 4096, nullptr);
  const cudaLaunchConfig_t plain = launch.config();
  EXPECT_EQ(plain.numAttrs, 0u);
  EXPECT_EQ(plain.gridDim.x, 6u);
  EXPECT_EQ(plain.gridDim.y, 2u);
  EXPECT_EQ(plain.blockDim.x, 128u);
  EXPECT_EQ(plain.dynamicSmemBytes, 4096u);
  const cudaLaunchConfig_t c = launch.cluster(3).pdl().cooperative().config();
  ASSERT_EQ(c.numAttrs, 3u);
  EXPECT_EQ(c.attrs[0].id, cudaLaunchAttributeClusterDimension);
  EXPECT_EQ(c.attrs[0].val.clusterDim.x, 3u);
  EXPECT_EQ(c.attrs[0].val.clusterDim.y, 1u);
  EXPECT_EQ(c.attrs[0].val.clusterDim.z, 1u);
  EXPECT_EQ(c.attrs[1].id, cudaLaunchAttributeProgrammaticStreamSerialization);
  EXPECT_EQ(c.attrs[1].val.programmaticStreamSerializationAllowed, 1);
  EXPECT_EQ(c.attrs[2].id, cudaLaunchAttributeCooperative);
  EXPECT_EQ(c.attrs[2].val.cooperative, 1);
}

TEST(LaunchConfig, RefusesAnAttributeAskedTwice) {
  detail::LaunchConfig launch(dim3(1), dim3(32), 0, nullptr);
  launch.pdl();
  EXPECT_THROW(launch.pdl(), Error);
  EXPECT_EQ(launch.config().numAttrs, 1u);
}

TEST(DeviceProps, NameAndPageableAccessFollowTheDevice) {
  const std::string& name = detail::device_name();
  EXPECT_EQ(&name, &detail::device_name());  // cached
  if (testing::gpu_available()) {
    EXPECT_FALSE(name.empty());
    EXPECT_EQ(detail::device_props().arch / 10, 9);
  } else if (detail::current_device() < 0) {
    EXPECT_TRUE(name.empty());
    EXPECT_EQ(detail::device_props().arch, 0);
    EXPECT_FALSE(detail::device_props().pageable_access);
  }
  EXPECT_FALSE(detail::h200_props().pageable_access);
}

}  // namespace
}  // namespace moekit
