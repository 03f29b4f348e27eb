#include "spec/test_jobs.h"

namespace downpour {

JobSpec SmallMlpJob(int num_workers, int num_shards) {
  JobSpec spec;
  spec.set_name("t");
  ModelSpec* model = spec.mutable_model();
  model->add_input_shape(8);
  model->set_num_classes(3);
  model->add_layer()->mutable_dense()->set_units(16);
  model->add_layer()->mutable_relu();
  model->add_layer()->mutable_dense()->set_units(3);
  model->add_layer()->mutable_softmax_cross_entropy();
  spec.mutable_dataset()->set_train_files("train-*");
  spec.mutable_dataset()->set_test_files("test-*");
  spec.mutable_dataset()->set_batch_size(4);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.set_num_workers(num_workers);
  spec.set_num_shards(num_shards);
  spec.set_steps(10);
  return spec;
}

ModelSpec SmallSparseModel() {
  ModelSpec model;
  model.set_num_classes(2);
  InputSpec* input = model.add_inputs();
  input->set_name("c");
  input->set_kind(InputSpec::SPARSE);
  LayerSpec* embedding = model.add_layer();
  embedding->set_name("e");
  embedding->add_inputs("c");
  embedding->mutable_embedding()->set_sparse(true);
  embedding->mutable_embedding()->set_vocab_size(100);
  embedding->mutable_embedding()->set_dim(4);
  model.add_layer()->mutable_dense()->set_units(2);
  model.add_layer()->mutable_softmax_cross_entropy();
  return model;
}

}  // namespace downpour
