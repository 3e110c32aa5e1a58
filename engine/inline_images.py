"""InlineImages: a batch's images that sit inside its text sequences (a vision-language model's, Qwen2-VL):
each one a grid of patches whose merged tokens take the place of a run of placeholder tokens in its
sequence. On the host, `inline_images` checks that run, orders each image's patches as the vision tower
merges them (merge x merge groups, row by row), and lays out what the model reads: each patch's row and
column (the tower's 2-D rotary), the batch rows its merged tokens replace, and every token's three M-RoPE
positions (temporal, height, width): a text token's three are its place, an image token's the image's
start, plus its merged row and column; the text after an image goes on from its start plus its longer
side. A sequence may hold several images, each its own run. An image that several sequences of the batch
hold (the same grid: a vision-language ranker's image query, in each of its pairs) runs through the vision
tower once, its merged tokens placed in each (`placed`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(slots=True)
class InlineImages:
    # [num_patches, patch_dim] uint8 on the device, the images' patches in merge order; None on the host,
    # where `patches` holds them
    pixels: torch.Tensor | None
    vision_positions: torch.Tensor  # [2, num_patches] int64: each patch's row and column in its image
    vision_grids: torch.Tensor  # [2, num_patches] int64: its image's rows and columns of patches
    vision_cu_seqlens: torch.Tensor  # host [num_images + 1] int32: the images' patches
    vision_max_seqlen: int
    token_rows: torch.Tensor  # [num_image_tokens] int64: the batch rows the merged patches replace, in order
    positions: torch.Tensor  # [3, num_tokens] int64: every token's temporal, height and width position
    # [num_image_tokens] int64: each of token_rows' row in the vision tower's merged output, where an image
    # held by several sequences ran once; None where each image ran for its own tokens
    merged_rows: torch.Tensor | None = None
    patches: Sequence[np.ndarray] = ()  # host: each image's [num_patches, patch_dim] in merge order

    def placed(self, merged: torch.Tensor) -> torch.Tensor:
        """The vision tower's merged rows (or what is made of them) in token_rows' order: a shared image's
        once for each sequence that holds it."""
        return merged if self.merged_rows is None else merged.index_select(0, self.merged_rows)

    def to(self, device: torch.device | str) -> InlineImages:
        cuda = torch.device(device).type == "cuda"

        def moved(tensor: torch.Tensor) -> torch.Tensor:
            return (tensor.pin_memory() if cuda else tensor).to(device, non_blocking=True)

        pixels = torch.from_numpy(np.concatenate(self.patches)) if self.pixels is None else self.pixels
        return InlineImages(
            moved(pixels), moved(self.vision_positions), moved(self.vision_grids), self.vision_cu_seqlens,
            self.vision_max_seqlen,
            moved(self.token_rows), moved(self.positions),
            None if self.merged_rows is None else moved(self.merged_rows),
        )  # fmt: skip


# a sequence's images (RowRequest.images' entry): none (a text), one grid, or several in the order they sit
ImageEntry = np.ndarray | tuple[np.ndarray, ...] | None


def images_of(entry: ImageEntry) -> tuple[np.ndarray, ...]:
    """The grids of a sequence's image entry, in order."""
    if entry is None:
        return ()
    return entry if isinstance(entry, tuple) else (entry,)


def image_entry(images: Sequence[np.ndarray | None]) -> ImageEntry:
    """The entry of a sequence that holds these images, in order (Nones left out)."""
    given = tuple(image for image in images if image is not None)
    return None if not given else given[0] if len(given) == 1 else given


def vision_patches(entry: ImageEntry) -> int:
    """The patches of a sequence's images (none for a text): the rows the vision tower runs for them, four
    for each merged token its sequence holds."""
    return sum(image.shape[0] * image.shape[1] for image in images_of(entry))


def check_image_runs(
    ids: Sequence[int] | np.ndarray, images: Sequence[np.ndarray], image_token: int, merge: int
) -> list[int]:
    """Where in `ids` each image's run of `image_token` starts; ValueError unless each grid merges by
    `merge` and the sequence holds one run of each image's merged tokens, in order, and no other."""
    wanted = []
    for image in images:
        rows, columns = image.shape[:2]
        if rows % merge or columns % merge:
            raise ValueError(f"an image of {rows}x{columns} patches does not merge by {merge}")
        wanted.append(rows * columns // merge**2)
    found = np.flatnonzero(np.asarray(ids) == image_token)
    runs = np.split(found, np.flatnonzero(np.diff(found) != 1) + 1) if len(found) else []
    if [len(run) for run in runs] != wanted:
        held = " and ".join(str(len(run)) for run in runs) or "0"
        raise ValueError(
            f"a sequence holds {held} image tokens, not one run of the {' and '.join(map(str, wanted))} its "
            f"image{'s' if len(wanted) > 1 else ''} take{'' if len(wanted) > 1 else 's'}"
        )
    return [int(run[0]) for run in runs]


def inline_images(
    cu_seqlens: np.ndarray,
    flat_ids: np.ndarray,
    images: Sequence[ImageEntry],
    image_token: int,
    merge: int,
    places: np.ndarray | None = None,
) -> InlineImages | None:
    """The images of a batch (pack's `images`: per sequence its grids of [rows, columns, patch_dim], see
    ImageEntry) whose sequences hold one run of `image_token` for each of their images, as long as its
    merged tokens; None where it has no image. ValueError where a sequence's runs do not match its images.
    `places`: each token's place (pack's positions: a text that continues a shared prefix goes on after
    it); by default each sequence's from 0."""
    if len(images) != len(cu_seqlens) - 1:
        raise ValueError(f"{len(images)} image entries for {len(cu_seqlens) - 1} sequences")
    num_tokens = int(cu_seqlens[-1])
    if places is None:
        places = np.arange(num_tokens) - np.repeat(cu_seqlens[:-1], np.diff(cu_seqlens))
    positions = np.repeat(places[None].astype(np.int64), 3, axis=0)  # a text token's three: its place
    patches, vision_positions, grids, token_rows, counts = [], [], [], [], []
    source_rows, ran = [], {}  # each image run: its first merged row, by the grid's identity
    for index, entry in enumerate(images):
        grids_here = images_of(entry)
        if not grids_here:
            continue
        start, end = int(cu_seqlens[index]), int(cu_seqlens[index + 1])
        firsts = check_image_runs(flat_ids[start:end], grids_here, image_token, merge)
        own = positions[:, start:end]
        token, place = 0, 0  # the next token of the sequence, and the place the text from it takes
        for first, image in zip(firsts, grids_here):
            rows, columns, patch_dim = image.shape
            merged_rows, merged_columns = rows // merge, columns // merge
            run = np.arange(first, first + merged_rows * merged_columns)
            if id(image) not in ran:
                ran[id(image)] = sum(counts) // merge**2
                # merge order: each merge x merge group of patches together, the groups row by row
                grouped = image.reshape(merged_rows, merge, merged_columns, merge, patch_dim).transpose(
                    0, 2, 1, 3, 4
                )
                patches.append(grouped.reshape(-1, patch_dim))
                row, column = np.meshgrid(np.arange(rows), np.arange(columns), indexing="ij")
                order = (merged_rows, merge, merged_columns, merge)
                vision_positions.append(
                    np.stack([part.reshape(order).transpose(0, 2, 1, 3).ravel() for part in (row, column)])
                )
                counts.append(rows * columns)
                grids.append(np.repeat([[rows], [columns]], rows * columns, axis=1))
            source_rows.append(ran[id(image)] + np.arange(len(run)))
            token_rows.append(start + run)
            own[:, token:first] = place + np.arange(first - token)
            place += first - token
            merged_row, merged_column = np.divmod(np.arange(len(run)), merged_columns)
            own[0, run] = place
            own[1, run] = place + merged_row
            own[2, run] = place + merged_column
            token, place = first + len(run), place + max(merged_rows, merged_columns)
        own[:, token:] = place + np.arange(end - start - token)
    if not patches:
        return None
    cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return InlineImages(
        None,
        torch.from_numpy(np.concatenate(vision_positions, axis=1)),
        torch.from_numpy(np.concatenate(grids, axis=1).astype(np.int64)),
        torch.from_numpy(cu),
        max(counts),
        torch.from_numpy(np.concatenate(token_rows).astype(np.int64)),
        torch.from_numpy(positions),
        torch.from_numpy(np.concatenate(source_rows)) if len(source_rows) > len(patches) else None,
        patches,
    )
