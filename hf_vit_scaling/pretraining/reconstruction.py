"""The reconstruction picture at the end of MAE pretraining: for each held-out image a row of three, as the paper's
Figure 2 shows them: the original, the masked input (hidden patches grey), and the reconstruction (the visible
patches as given, the masked ones as the decoder predicts them).

Drawn with PIL (always installed with transformers' image processors), so the picture needs no plotting extra:
every cell is the image enlarged to at least `MIN_CELL` pixels, `GAP` pixels between cells; the PNG's text chunk
says its rows and columns (`read_layout`).
"""

import torch
from PIL import Image, PngImagePlugin

COLUMNS = ("original", "masked", "reconstruction")
MIN_CELL = 64
GAP = 2
MASK_VALUE = 0.0  # in the processor's normalised space: its mean, grey
FILENAME = "reconstructions.png"


def predicted_pixels(model, logits: torch.Tensor, target_patches: torch.Tensor) -> torch.Tensor:
    """The decoder's patches in the input's pixel space: with `norm_pix_loss` the decoder predicts each patch
    normalised by its own mean and variance, so they are put back (as the MAE authors' visualisation does)."""
    if not model.config.norm_pix_loss:
        return logits
    mean = target_patches.mean(dim=-1, keepdim=True)
    var = target_patches.var(dim=-1, keepdim=True)
    return logits * (var + 1.0e-6) ** 0.5 + mean


def reconstruct(model, pixel_values: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """{"original", "masked", "reconstruction"}: (batch, C, H, W) in the model's normalised input space, one random
    mask per image drawn from `seed` (not from the run's generator). `pixel_values` is a batch as the data loader
    gives it (uint8 on the device input path): the model's input hooks make what the encoder sees, which a last
    pre-hook keeps as the original. Runs the model's forward: call on every rank under ZeRO-3 and FSDP2."""
    batch = pixel_values.shape[0]
    patches = model.vit.embeddings.patch_embeddings.num_patches
    generator = torch.Generator().manual_seed(seed)
    noise = torch.rand(batch, patches, generator=generator).to(pixel_values.device)
    seen = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["pixel_values"]), with_kwargs=True)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(pixel_values=pixel_values, noise=noise)
    finally:
        hook.remove()
        model.train(was_training)
    pixel_values = seen[0].float()
    with torch.no_grad():
        target = model.patchify(pixel_values)
        prediction = predicted_pixels(model, out.logits.float(), target)
        mask = out.mask.float().unsqueeze(-1)  # 1: hidden from the encoder
        masked = target * (1 - mask) + MASK_VALUE * mask
        pasted = target * (1 - mask) + prediction * mask
    size = tuple(pixel_values.shape[-2:])
    return {
        "original": pixel_values,
        "masked": model.unpatchify(masked, size),
        "reconstruction": model.unpatchify(pasted, size),
    }


def to_unit_range(images: torch.Tensor, mean, std) -> torch.Tensor:
    """Processor-normalised images back to [0, 1]."""
    mean = torch.tensor(mean, dtype=images.dtype).view(1, -1, 1, 1)
    std = torch.tensor(std, dtype=images.dtype).view(1, -1, 1, 1)
    return (images.cpu() * std + mean).clamp(0, 1)


def grid_image(columns: dict[str, torch.Tensor]) -> Image.Image:
    """One RGB image: a row per image, a column per entry of `columns` ((batch, 3, H, W) in [0, 1])."""
    first = next(iter(columns.values()))
    rows, _, height, width = first.shape
    scale = max(1, -(-MIN_CELL // max(height, width)))
    cell_h, cell_w = height * scale, width * scale
    canvas = Image.new("RGB", (GAP + len(columns) * (cell_w + GAP), GAP + rows * (cell_h + GAP)), "white")
    for c, images in enumerate(columns.values()):
        for r in range(rows):
            array = (images[r].permute(1, 2, 0).numpy() * 255).round().astype("uint8")
            cell = Image.fromarray(array).resize((cell_w, cell_h), Image.NEAREST)
            canvas.paste(cell, (GAP + c * (cell_w + GAP), GAP + r * (cell_h + GAP)))
    return canvas


def save_reconstructions(path: str, images: dict[str, torch.Tensor], mean, std, mask_ratio: float) -> None:
    """Write the picture with its layout in the PNG's text chunk."""
    columns = {name: to_unit_range(images[name], mean, std) for name in COLUMNS}
    rows = next(iter(columns.values())).shape[0]
    info = PngImagePlugin.PngInfo()
    info.add_text("rows", str(rows))
    info.add_text("columns", ",".join(COLUMNS))
    info.add_text("mask_ratio", str(mask_ratio))
    grid_image(columns).save(path, pnginfo=info)


def read_layout(path: str) -> dict:
    """{"rows": int, "columns": [...], "size": (width, height)} of a picture written by `save_reconstructions`."""
    with Image.open(path) as image:
        image.load()
        text = dict(image.text)
        return {"rows": int(text["rows"]), "columns": text["columns"].split(","), "size": image.size}
