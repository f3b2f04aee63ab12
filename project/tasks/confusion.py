"""The test confusion matrix as a picture for TensorBoard, for any classification task."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from project.shown import shown

CONFUSION_IMAGE_UP_TO = 60  # classes; a larger matrix is unreadable as an image


def render_confusion_matrix(matrix: torch.Tensor, names: list[str], cell: int = 30) -> torch.Tensor:
    """A CHW uint8 image of `matrix` (rows: true class, columns: predicted), shaded by row share, with
    counts in the cells and the class names and per-class accuracy on the axes.

    PIL rather than matplotlib: training does not need a plotting library.
    """
    matrix = matrix.to(torch.int64)
    n = len(matrix)
    rows = matrix.sum(1).clamp(min=1)
    share = matrix.float() / rows[:, None]
    font = ImageFont.load_default()
    names = [shown(name) for name in names]  # a stranger's names: a line break or a control drawn as its escape
    labels = [f"{name[:14]} {100 * share[i, i]:.0f}%" for i, name in enumerate(names)]
    left = 8 + max(int(font.getlength(label)) for label in labels)
    top = 8 + max(int(font.getlength(name[:14])) for name in names)
    image = Image.new("RGB", (left + n * cell + 8, top + n * cell + 24), "white")
    draw = ImageDraw.Draw(image)
    for i in range(n):
        draw.text((4, top + i * cell + cell // 3), labels[i], fill="black", font=font)
        column = Image.new("RGB", (top, cell), "white")  # the predicted-class names, rotated
        ImageDraw.Draw(column).text((4, cell // 3), names[i][:14], fill="black", font=font)
        image.paste(column.rotate(90, expand=True), (left + i * cell, 0))
        for j in range(n):
            s = float(share[i, j])
            if i == j:  # green for right, blue for wrong
                color = (int(255 - 200 * s), 255, int(255 - 200 * s))
            else:
                color = (int(255 - 205 * s), int(255 - 155 * s), 255)
            box = (left + j * cell, top + i * cell, left + (j + 1) * cell - 1, top + (i + 1) * cell - 1)
            draw.rectangle(box, fill=color, outline=(220, 220, 220))
            count = int(matrix[i, j])
            if count:
                draw.text((box[0] + 3, box[1] + cell // 3), str(count), fill="black" if s < 0.6 else "white", font=font)
    draw.text((left, top + n * cell + 6), "rows: true class   columns: predicted", fill="black", font=font)
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
