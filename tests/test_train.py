"""TrainModel: a small ResNet-style CNN trained in the bubbles of a manual loop."""

import time

import pytest

import freeride as fr

torch = pytest.importorskip("torch")
nn = torch.nn


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


def tiny_resnet(classes=4):
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        Block(8),
        Block(8),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, classes),
    )


def synthetic_batches(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        y = torch.randint(0, 4, (16,), generator=g)
        x = torch.randn(16, 3, 12, 12, generator=g) * 0.3
        x[:, 0] += y.view(-1, 1, 1).float()  # a learnable signal
        out.append((x, y))
    return out


def test_loss_falls_when_trained_in_bubbles(host):
    torch.manual_seed(0)
    model = tiny_resnet()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    task = fr.tasks.TrainModel(
        model, synthetic_batches(), opt, nn.functional.cross_entropy, steps=60
    )
    handle = host.submit(task)
    deadline = time.monotonic() + 120
    while not handle.done():  # a manual loop: compute, then a bubble
        assert time.monotonic() < deadline, f"only {handle.items_done} steps in 120 s"
        with host.iteration():
            for _ in range(4):
                with host.compute():
                    time.sleep(0.002)
                time.sleep(0.02)
    out = handle.result()
    losses = out["losses"]
    assert len(losses) == 60 and handle.items_done == 60
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    assert task.memory_bytes > 4 * sum(p.numel() * 4 for p in model.parameters()) - 1


def test_model_on_another_device_is_refused(host):
    model = nn.Linear(4, 2, device="meta")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [(torch.zeros(2, 4, device="meta"), torch.zeros(2, 2, device="meta"))]
    task = fr.tasks.TrainModel(model, batches, opt, nn.functional.mse_loss, steps=1)
    with pytest.raises(ValueError, match="model is on meta but the harvester is on cpu"):
        host.submit(task)


class _Recording(nn.Module):
    """A linear layer that notes the first input of each forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)
        self.inputs: list[int] = []

    def forward(self, x):
        self.inputs.append(int(x.item()))
        return self.linear(x)


@pytest.mark.parametrize("one_shot", [True, False])
def test_every_batch_is_trained_on_in_order(host, one_shot):
    # The constructor looks at the first batch: from a generator that look took it, and
    # training ran on batches 1, 2, 1, 2 of three.
    model = _Recording()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.full((1, 1), float(k)), torch.zeros(1, 1)) for k in range(3)]
    batches = (pair for pair in data) if one_shot else data
    task = fr.tasks.TrainModel(model, batches, opt, nn.functional.mse_loss, steps=6)
    assert len(host.submit(task).result(timeout=30)["losses"]) == 6
    assert model.inputs == [0, 1, 2, 0, 1, 2]


def test_train_model_argument_errors():
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.zeros(2, 4), torch.zeros(2, 2))]
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        fr.tasks.TrainModel(object(), data, opt, nn.functional.mse_loss, 1)
    with pytest.raises(TypeError, match="optimizer must be"):
        fr.tasks.TrainModel(model, data, object(), nn.functional.mse_loss, 1)
    with pytest.raises(ValueError, match="batches must not be empty"):
        fr.tasks.TrainModel(model, [], opt, nn.functional.mse_loss, 1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        fr.tasks.TrainModel(model, data, opt, nn.functional.mse_loss, 0)
    with pytest.raises(ValueError, match="batch inputs are on meta"):
        fr.tasks.TrainModel(
            model,
            [(torch.zeros(2, 4, device="meta"), torch.zeros(2, 2))],
            opt,
            nn.functional.mse_loss,
            1,
        )


def test_train_model_counts_against_the_budget():
    model = nn.Linear(256, 256)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    task = fr.tasks.TrainModel(
        model, [(torch.zeros(2, 256), torch.zeros(2, 256))], opt, nn.functional.mse_loss, 1
    )
    with fr.Harvester("cpu", memory_budget="64KiB", workers=1) as h:
        handle = h.submit(task)
        assert handle.wait(10) and handle.state == "failed"
        with pytest.raises(fr.MemoryBudgetError):
            handle.result()
