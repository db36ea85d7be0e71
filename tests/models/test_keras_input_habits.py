"""Keras' input habits: float pixels in [0, 255] from `image_dataset_from_directory` and Keras'
augmentation layers train the default model unchanged; images in [0, 1] are reported once."""

import warnings

import keras
import numpy as np
import pytest

import keras_efficientnet as ke

SIZE = 32


@pytest.mark.tf_only
def test_image_dataset_from_directory_augmentation_and_fit(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, channel in (("red", 0), ("blue", 2)):
        (tmp_path / label).mkdir()
        for i in range(6):
            image = rng.integers(0, 80, (40, 44, 3), dtype=np.uint8)
            image[..., channel] += 170
            Image.fromarray(image).save(tmp_path / label / f"{i}.png")
    # Exactly what Keras' image-classification tutorial does, with the model unchanged.
    train = keras.utils.image_dataset_from_directory(
        tmp_path, image_size=(SIZE, SIZE), batch_size=4, seed=0, verbose=False)
    augment = keras.Sequential([keras.layers.RandomFlip("horizontal"),
                                keras.layers.RandomRotation(0.1),
                                keras.layers.RandomZoom(0.1)])
    train = train.map(lambda x, y: (augment(x, training=True), y))
    images, _ = next(iter(train))
    assert images.dtype == "float32" and float(images.numpy().max()) > 1.0  # [0, 255] floats
    keras.utils.set_random_seed(0)
    model = ke.EfficientNet("tiny", classes=2, input_shape=(SIZE, SIZE, 3))
    model.compile(keras.optimizers.SGD(0.01), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    history = model.fit(train, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"])) and len(history.history["loss"]) == 2
    # The trained model gives the same answer for the uint8 pixels of the same images.
    batch = np.round(images.numpy()).astype("uint8")
    np.testing.assert_allclose(model.predict(batch, verbose=0),
                               model.predict(batch.astype("float32"), verbose=0),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.jax_cpu_slow
def test_images_in_unit_range_are_reported_once():
    model = ke.EfficientNet("tiny", classes=3, input_shape=(SIZE, SIZE, 3))
    unit = np.random.default_rng(0).random((2, SIZE, SIZE, 3)).astype("float32")
    with pytest.warns(UserWarning, match=r"takes pixel values in \[0, 255\].*multiply them "
                      "by 255") as caught:
        model.predict(unit, verbose=0)
        model.predict(unit, verbose=0)
        model(unit)
    assert len([w for w in caught if "[0, 255]" in str(w.message)]) == 1
    fresh = ke.EfficientNet("tiny", classes=3, input_shape=(SIZE, SIZE, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pixels in [0, 255] (and uint8) warn nothing
        fresh.predict(unit * 255, verbose=0)
        fresh(np.zeros((1, SIZE, SIZE, 3), "uint8"))
    with pytest.warns(UserWarning, match=r"\[0, 1\]"):  # an eager call warns too
        fresh(unit)
