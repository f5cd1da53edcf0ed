"""The reference network of the torch side of the kit: a small LeNet-like CNN for the
8x8 handwritten digits of :func:`sgd_shm.data.load_digits_split` and
:func:`sgd_shm.data.make_digits_augmented`.

LeNet (LeCun, Bottou, Bengio, Haffner, "Gradient-based learning applied to document
recognition", Proc. IEEE 1998) alternates convolutions with subsampling and ends in
fully connected layers; :class:`DigitsCNN` is that shape cut down to an 8x8 input:
two 3x3 convolutions (padding 1, ReLU), each followed by 2x2 max pooling (8x8 -> 4x4
-> 2x2), then one hidden fully connected layer (ReLU) and the class scores (logits;
the loss, ``cross_entropy``, applies the softmax). With the default widths it has
13,706 parameters in 8 tensors (4 layers), so a layer-wise block partition
(:meth:`sgd_shm.torch.TorchModel.blocks`) has up to 4 parts.

Example::

    import torch
    from sgd_shm.torch import DigitsCNN
    net = DigitsCNN()
    logits = net(torch.zeros(5, 1, 8, 8))        # (5, 10)
    net.input_shape                              # (1, 8, 8): what TorchModel reads
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

__all__ = ["DigitsCNN"]


class DigitsCNN(nn.Module):
    """A LeNet-like CNN for (n, 1, 8, 8) float32 images in [0, 1] (see the module
    notes): conv(1 -> ``c1``) -> ReLU -> maxpool -> conv(``c1`` -> ``c2``) -> ReLU ->
    maxpool -> linear(4 ``c2`` -> ``hidden``) -> ReLU -> linear(``hidden`` ->
    ``n_classes``). ``input_shape`` declares the shape of one sample (what
    :class:`~sgd_shm.torch.TorchModel` checks X against). The layers followed by a
    ReLU start from He's initialisation (normal, variance 2 / fan-in; zero biases: He,
    Zhang, Ren, Sun, ICCV 2015), under which plain SGD without momentum learns in a
    few epochs; the output layer from torch's default. The draws come from torch's
    global generator (``torch.manual_seed``), or from ``seed`` when given (the global
    generator is then left as it was)."""

    input_shape = (1, 8, 8)

    def __init__(self, c1=16, c2=32, hidden=64, n_classes=10, *, seed=None):
        super().__init__()
        for name, v in (("c1", c1), ("c2", c2), ("hidden", hidden), ("n_classes", n_classes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        if n_classes < 2:
            raise ValueError(f"n_classes: must be >= 2 (a classifier), got {n_classes}")
        fork = (torch.random.fork_rng(devices=[]) if seed is not None
                else contextlib.nullcontext())
        with fork:
            if seed is not None:
                torch.manual_seed(int(seed))
            self.conv1 = nn.Conv2d(1, c1, 3, padding=1)
            self.conv2 = nn.Conv2d(c1, c2, 3, padding=1)
            self.fc1 = nn.Linear(4 * c2, hidden)
            self.fc2 = nn.Linear(hidden, n_classes)
            for layer in (self.conv1, self.conv2, self.fc1):     # He: ReLU follows them
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
                nn.init.zeros_(layer.bias)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)

