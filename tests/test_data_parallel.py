"""Parallel and exact: a training read gives the same batches, byte for byte, on 1 core and on several.

The process's cores are what the pipeline sizes its thread pool (and its augmentation workers) by, so each
route is read twice from the same seed, once as if the process could use one core (``os.sched_getaffinity``)
and once four, and the batches compared. Images are real photos (scikit-image), cropped and flipped into
distinct 32 px pictures, so that every crop and augmentation has texture to move.
"""
import os

import numpy as np
import pytest
from PIL import Image
from skimage import data as skdata

import kaggle_utils.data as kd

SIZE, COUNT, BATCH, BATCHES = 32, 40, 8, 7  # 56 examples read: past the end of the first epoch


def photos(count: int) -> np.ndarray:
    sources = [skdata.astronaut(), skdata.coffee(), skdata.chelsea(), skdata.rocket()]
    out = []
    for k in range(count):
        image = sources[k % 4]
        y, x = (37 * k) % (image.shape[0] // 2), (53 * k) % (image.shape[1] // 2)
        crop = image[y:y + image.shape[0] // 2, x:x + image.shape[1] // 2]
        crop = crop[:, ::-1] if k % 3 else crop
        out.append(np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((SIZE, SIZE), Image.BILINEAR)))
    return np.stack(out)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    images = photos(COUNT)
    kd.write_split(root / "train", images, labels=[k % 5 for k in range(COUNT)], num_files=3)
    multi_hot = np.stack([np.eye(4)[k % 4] + np.eye(4)[(k // 4) % 4] for k in range(COUNT)]).clip(0, 1)
    kd.write_split(root / "multi", images, labels=multi_hot, num_files=3)
    for k, image in enumerate(images):
        (root / "folders" / f"class{k % 3}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / "folders" / f"class{k % 3}" / f"{k}.png")
    return root


def _selection(root):
    from kaggle_utils.data.tfrecords import scan_records

    index = scan_records(kd.list_tfrecords(root / "train"))
    return index.pairs(np.flatnonzero(np.arange(len(index)) % 4 != 1))  # three folds of four


ROUTES = {
    "no augmentation": lambda root, seed: kd.load_dataset(root / "train", image_size=SIZE, batch_size=BATCH,
                                                          training=True, seed=seed),
    "random-resized crop (also randaugment-device's host part)": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, crop=kd.RandomResizedCrop(24)),
    "TF RandAugment after a crop": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, crop=kd.RandomResizedCrop(24),
        augment="randaugment"),
    "imgaug in workers that decode": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, augment="imgaug"),
    "imgaug in workers after a crop": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, crop=kd.RandomResizedCrop(24),
        augment="imgaug"),
    "imgaug in the tf.data thread": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, augment="imgaug",
        augment_workers=0),
    "multi-label": lambda root, seed: kd.load_dataset(
        root / "multi", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, multi_label_classes=4,
        crop=kd.RandomResizedCrop(24)),
    "a selection (cross-validation fold)": lambda root, seed: kd.load_dataset(
        root / "train", image_size=SIZE, batch_size=BATCH, training=True, seed=seed, select=_selection(root),
        crop=kd.RandomResizedCrop(24)),
    "class folders": lambda root, seed: kd.load_source(
        kd.class_folders(root / "folders"), batch_size=BATCH, training=True, seed=seed,
        crop=kd.RandomResizedCrop(24)),
}


def read(make, root, seed, cores, monkeypatch):
    """The first batches of ``make(root, seed)``, built as if the process could run on ``cores`` cores."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    dataset = make(root, seed)
    try:
        iterator = iter(dataset)
        return [next(iterator) for _ in range(BATCHES)]
    finally:
        dataset.close()


@pytest.mark.parametrize("route", ROUTES)
def test_one_core_and_four_give_the_same_batches(data, route, monkeypatch):
    one = read(ROUTES[route], data, 7, 1, monkeypatch)
    four = read(ROUTES[route], data, 7, 4, monkeypatch)
    for a, b in zip(one, four, strict=True):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    other_seed = read(ROUTES[route], data, 8, 1, monkeypatch)  # the comparison can fail: a seed changes the batches
    assert not all(np.array_equal(a["image"], b["image"]) for a, b in zip(one, other_seed))


def test_a_seeded_numpy_augmentation_is_the_same_whichever_worker_takes_the_batch():
    from concurrent.futures import ThreadPoolExecutor

    images = photos(4)
    with kd.ProcessPoolAugmenter(kd.ImgaugRandAugment(), num_workers=2) as pool:
        with ThreadPoolExecutor(pool.num_slots) as threads:  # calls at once: both workers take some
            results = list(threads.map(lambda seed: pool(images, seed=seed), [5] * 7 + [6]))
    assert all(np.array_equal(results[0], r) for r in results[1:7]) and not np.array_equal(results[0], results[7])
    assert not np.array_equal(results[0], images)
