// Distributed data parallel training with liblockstep, one process per device: copy this to
// start your own. Run it as N processes with any launcher:
//
//   mpirun -n 2 build/bin/ddp_train
//   torchrun --nproc-per-node 2 --no-python build/bin/ddp_train
//
// Every rank builds the model, joins the job, and trains on its share of each global batch;
// the weights after every step are the same bits on every rank, and the same as on one
// process (run it without a launcher), because Lockstep sums gradients as one fixed tree.
#include <cstdio>
#include <cstdlib>

#include "lockstep/comm/init.h"
#include "lockstep/core/parallel.h"
#include "lockstep/data/dataloader.h"
#include "lockstep/data/fashion_mnist.h"
#include "lockstep/nn/models.h"
#include "lockstep/ops/ops.h"
#include "lockstep/optim/sgd.h"
#include "lockstep/parallel/distributed_data_parallel.h"

using namespace lockstep;

int main(int argc, char** argv) {
  const int64_t steps = argc > 1 ? std::atoll(argv[1]) : 200;
  const char* data_dir = argc > 2 ? argv[2] : kFashionMnistDefaultDir;
  constexpr int64_t kGlobalBatch = 64, kMicroBatch = 16;
  constexpr uint64_t kSeed = 0;
  try {
    // Who am I, and where do the others meet: RANK/WORLD_SIZE/MASTER_ADDR (torchrun),
    // OMPI_COMM_WORLD_* (mpirun) or SLURM_* (srun); no launcher means a world of one.
    std::shared_ptr<comm::Communicator> comm = comm::init_process_group("auto");
    set_num_threads(1);

    // Any module; rank 0's initial weights are broadcast to the others.
    std::shared_ptr<nn::Module> model = nn::make_model("cnn", kSeed);
    parallel::DistributedDataParallel ddp(
        model,
        [](std::vector<Tensor> params) {
          return std::make_unique<optim::SGD>(std::move(params), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
        },
        comm,
        // The loss: one cross-entropy per sample of the batch's fields.
        {.loss = parallel::classification_loss("image", "label"), .micro_batch = kMicroBatch, .zero_stage = 0});

    // Every rank reads the same global batches (one order per seed and epoch) and trains on
    // its contiguous share of each.
    DataLoader loader(load_fashion_mnist(data_dir, Split::train),
                      {.batch_size = kGlobalBatch, .shuffle = true, .seed = kSeed, .drop_last = true});
    for (int64_t step = 0; step < steps;) {
      const std::optional<Batch> batch = loader.next();
      if (!batch) continue;  // next epoch
      const parallel::StepResult result = ddp.step(
          batch->samples, {.seed = kSeed, .step = static_cast<uint64_t>(step), .first_sample = batch->first_position});
      ++step;
      if (comm->rank() == 0 && (step % 50 == 0 || step == steps))
        std::printf("step %lld  loss %.6f\n", static_cast<long long>(step), result.loss);
    }
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "ddp_train: %s\n", error.what());
    return 1;
  }
}
