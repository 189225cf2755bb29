# The TensorFlow TPU walk-through's program ("Putting It All Together") on the
# emulated pod: the same program as for a Cloud TPU, with only its first line
# changed (was: import tensorflow as tf). TPU_NAME names the TPU (a TPU name,
# grpc://HOST:8470, or a comma list of hosts), as for TensorFlow.
import tpuemu.tf as tf            # was: import tensorflow as tf
resolver = tf.distribute.cluster_resolver.TPUClusterResolver()   # $TPU_NAME or grpc://host:8470, as TF
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
BATCH_SIZE = 128 * strategy.num_replicas_in_sync
tf.keras.mixed_precision.set_global_policy(tf.keras.mixed_precision.Policy('mixed_bfloat16'))
(x, y), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()   # from Debian's dataset-fashion-mnist
dataset = tf.data.Dataset.from_tensor_slices((x.reshape(-1, 784) / 255.0, y)).shuffle(60000).batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)
test_dataset = tf.data.Dataset.from_tensor_slices((x_test.reshape(-1, 784) / 255.0, y_test)).batch(BATCH_SIZE)
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(128, activation='relu'), tf.keras.layers.Dense(10, activation='softmax')])
    model.compile(optimizer='adam', loss='sparse_categorical_crossentropy', metrics=['accuracy'])
tb = tf.keras.callbacks.TensorBoard(log_dir="logs", profile_batch='10,20')
model.fit(dataset, epochs=10, callbacks=[tb])
model.evaluate(test_dataset)
