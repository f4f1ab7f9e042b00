# Read by ctest after the discovered tests: the seconds the longest take (release build, two
# cores), so that a clean build's first run starts them first, as later runs do from
# ctest's own cost data, instead of ending with one of them running alone. A name that is
# not a test of this build (the TSan build has few) is passed over.
foreach(entry IN ITEMS
    "TrainCommandLong.DefaultRunsReachTheirAccuracy=124"
    "Slurm.SbatchSignalStopsTheRunWithACheckpointThatContinuesExactly=47"
    "PlanCommand.PredictedPeakMemoryIsWithinTenPercentOfTraining=20"
    "TrainCommand.SameWeightsOnOneTwoAndFourDevices=17"
    "MultiHost.DdpAndZeroAcrossTwoHostsGiveOneDevicesBits=15"
    "GptModel.ParameterNamesShapesAndCount=10"
    "MultiHost.TheGptMeshAcrossHostsKeepsItsBits=8")
  string(REPLACE "=" ";" pair "${entry}")
  list(GET pair 0 name)
  list(GET pair 1 seconds)
  set_tests_properties("${name}" PROPERTIES COST "${seconds}")
endforeach()
