# A custom training loop on the emulated pod, as TensorFlow's "Custom training
# with tf.distribute.Strategy" writes it for a TPU: the dataset distributed
# over the replicas, strategy.run of a training step on every core, the
# per-replica losses reduced with strategy.reduce, and preemption handled by a
# PreemptionCheckpointHandler (a notice: the checkpoint is saved and the
# program exits with status 42; started again, it resumes from there).
# The cores run the model's built-in steps: strategy.run takes model.train_step
# (forward, backward, gradients all-reduced, Adam), model.test_step or
# model.predict_step, not a Python function.
#
#   TPU_NAME=grpc://127.0.0.1:8470 python3 examples/python/custom_loop.py
import os
import sys

import tpuemu.tf as tf

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
GLOBAL_BATCH_SIZE = 128 * strategy.num_replicas_in_sync

(x, y), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
train_dataset = tf.data.Dataset.from_tensor_slices((x.reshape(-1, 784) / 255.0, y)).shuffle(60000).batch(
    GLOBAL_BATCH_SIZE, drop_remainder=True)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test.reshape(-1, 784) / 255.0, y_test)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)

with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(128, activation="relu", input_shape=(784,)),
                                 tf.keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(0.001), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])

checkpoint = tf.train.Checkpoint(model=model)
handler = tf.distribute.experimental.PreemptionCheckpointHandler(
    resolver, checkpoint, checkpoint_dir=os.environ.get("CHECKPOINT_DIR", "/tmp/tpuemu-custom-loop"))


def distributed_train_step(dataset_inputs):
    per_replica_losses = strategy.run(model.train_step, args=(dataset_inputs,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


def distributed_test_step(dataset_inputs):
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(model.test_step, args=(dataset_inputs,)),
                           axis=None)


steps_per_epoch = len(train_dataset)
start_epoch = handler.total_run_calls // steps_per_epoch
for epoch in range(start_epoch, EPOCHS):
    total_loss, num_batches = 0.0, 0
    done = handler.total_run_calls - epoch * steps_per_epoch  # steps of this epoch done before a restart
    for i, x in enumerate(train_dist_dataset):
        if i < done:
            continue
        total_loss += float(handler.run(distributed_train_step, x))
        num_batches += 1
    test_loss = sum(float(distributed_test_step(x)) for x in test_dist_dataset) / len(test_dataset)
    print("Epoch %d, Loss: %.4f, Test loss: %.4f" % (epoch + 1, total_loss / max(num_batches, 1), test_loss),
          flush=True)
loss, accuracy = model.evaluate(test_dataset, verbose=0)
print("test accuracy: %.4f" % accuracy)
