"""InducingGPNetwork's tasks as likelihood objects: the task follows from the likelihood's type,
``likelihood(model(x))`` works for every task, and the ``task`` string is a convenience."""

import gpytorch
import pytest
import torch

from gpext.errors import InputDataError, InputTypeError
from gpext.likelihoods import DirichletTransform, DirichletTransformLikelihood
from gpext.models import InducingGPNetwork
from gpext.nn import MLP


def _net(seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("num_inducing", 6)
    return InducingGPNetwork(MLP(2, [8], 3), **kwargs).double()


def _data(n=60, classes=3):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, classes, (n,), generator=gen)


class TestTaskFromLikelihood:
    @pytest.mark.parametrize(
        ("likelihood", "num_classes", "task"),
        [
            (None, None, "regression"),
            (gpytorch.likelihoods.GaussianLikelihood(), None, "regression"),
            (gpytorch.likelihoods.BernoulliLikelihood(), None, "binary"),
            (gpytorch.likelihoods.BernoulliLikelihood(), 2, "binary"),
            (gpytorch.likelihoods.BernoulliLikelihood(), 4, "one_vs_all"),
            (DirichletTransformLikelihood(3), None, "dirichlet"),
        ],
    )
    def test_the_likelihood_decides_the_task(self, likelihood, num_classes, task):
        model = _net(likelihood=likelihood, num_classes=num_classes)
        assert model.task == task
        if likelihood is not None:
            assert model.likelihood is likelihood
        heads = {"regression": (), "binary": (), "one_vs_all": (4,), "dirichlet": (3,)}[task]
        assert model.gp.batch_shape == heads

    @pytest.mark.parametrize(
        ("task", "kind"),
        [
            ("regression", gpytorch.likelihoods.GaussianLikelihood),
            ("binary", gpytorch.likelihoods.BernoulliLikelihood),
            ("one_vs_all", gpytorch.likelihoods.BernoulliLikelihood),
            ("dirichlet", DirichletTransformLikelihood),
        ],
    )
    def test_task_strings_give_the_default_likelihoods(self, task, kind):
        model = _net(task=task, num_classes=None if task in ("regression", "binary") else 3)
        assert model.task == task and isinstance(model.likelihood, kind)
        assert (model.dirichlet_transform is not None) == (task == "dirichlet")

    def test_task_string_and_likelihood_object_build_the_same_model(self):
        x, y = _data()
        by_name = _net(task="dirichlet", num_classes=3)
        by_object = _net(likelihood=DirichletTransformLikelihood(3))
        by_name.initialize(x, y, generator=torch.Generator().manual_seed(0))
        by_object.initialize(x, y, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(by_name.loss(x, y), by_object.loss(x, y), rtol=0, atol=0)
        ova = _net(task="one_vs_all", num_classes=3)
        ova_obj = _net(likelihood=gpytorch.likelihoods.BernoulliLikelihood(), num_classes=3)
        assert ova_obj.task == "one_vs_all"
        ova.initialize(x, y, generator=torch.Generator().manual_seed(0))
        ova_obj.initialize(x, y, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(ova.loss(x, y), ova_obj.loss(x, y), rtol=0, atol=0)

    def test_a_given_dirichlet_transform_is_kept(self):
        transform = DirichletTransform(3, alpha_epsilon=0.05)
        model = _net(task="dirichlet", num_classes=3, dirichlet_transform=transform)
        assert model.dirichlet_transform is transform and model.likelihood.transform is transform
        assert model.likelihood.alpha_epsilon == 0.05

    def test_errors(self):
        with pytest.raises(InputTypeError, match="BernoulliLikelihood for task='binary'"):
            _net(task="binary", likelihood=gpytorch.likelihoods.GaussianLikelihood())
        with pytest.raises(InputTypeError, match="GaussianLikelihood for task='regression'"):
            _net(task="regression", likelihood=gpytorch.likelihoods.BernoulliLikelihood())
        with pytest.raises(InputTypeError, match="StudentTLikelihood"):
            _net(likelihood=gpytorch.likelihoods.StudentTLikelihood())
        with pytest.raises(InputDataError, match="num_classes"):
            _net(likelihood=DirichletTransformLikelihood(3), num_classes=4)
        with pytest.raises(InputDataError, match="num_classes"):
            _net(task="dirichlet", num_classes=3, dirichlet_transform=DirichletTransform(4))
        with pytest.raises(InputDataError, match="dirichlet_transform"):
            _net(
                likelihood=DirichletTransformLikelihood(3),
                dirichlet_transform=DirichletTransform(3),
            )
        with pytest.raises(InputDataError, match="dirichlet_transform"):
            _net(task="binary", dirichlet_transform=DirichletTransform(2))
        with pytest.raises(InputDataError, match="task"):
            _net(task="ordinal")
        with pytest.raises(InputTypeError, match="num_classes"):
            _net(task="one_vs_all")  # no num_classes


class TestLikelihoodOfModel:
    """``model.likelihood(model(x))`` is the predictive distribution for every task."""

    def test_regression(self):
        x, _ = _data()
        y = torch.sin(x[:, 0])
        model = _net()
        model.fit(
            x, y, epochs=2, batch_size=30, generator=torch.Generator().manual_seed(0), min_steps=0
        )
        with torch.no_grad():
            pred = model.likelihood(model(x[:7]))
        mean, var = model.predict(x[:7])
        torch.testing.assert_close(pred.mean, mean)
        torch.testing.assert_close(pred.variance, var)

    def test_binary_and_one_vs_all(self):
        x, y = _data()
        for task, labels, classes in (("binary", y % 2, None), ("one_vs_all", y, 3)):
            model = _net(task=task, num_classes=classes)
            model.fit(
                x, labels, epochs=2, batch_size=30, generator=torch.Generator().manual_seed(0),
                min_steps=0,
            )  # fmt: skip
            with torch.no_grad():
                probs = model.likelihood(model(x[:5])).probs
            mean, var = model.predict(x[:5])
            torch.testing.assert_close(probs, torch.special.ndtr(mean / (1 + var).sqrt()))

    def test_dirichlet(self):
        x, y = _data()
        model = _net(task="dirichlet", num_classes=3)
        model.fit(
            x, y, epochs=2, batch_size=30, generator=torch.Generator().manual_seed(0), min_steps=0
        )
        with torch.no_grad():
            latent = model(x[:5])
            marginal = model.likelihood(latent, labels=y[:5])  # transformed targets
            probs = model.likelihood.class_probs(
                latent, num_samples=64, generator=torch.Generator().manual_seed(3)
            )
        mean, var = model.predict(x[:5])
        noise = model.likelihood.transform_labels(y[:5], torch.float64).noise
        torch.testing.assert_close(marginal.mean, mean)
        torch.testing.assert_close(marginal.variance, var + noise)
        ref = model.predict_proba(x[:5], num_samples=64, generator=torch.Generator().manual_seed(3))
        torch.testing.assert_close(probs, ref)
        with pytest.raises(InputDataError, match="class_probs"):
            model.likelihood(latent)  # which labels' noise: the likelihood says what to do

    def test_dirichlet_likelihood_with_a_learned_extra_noise_enters_the_loss(self):
        x, y = _data()
        lik = DirichletTransformLikelihood(3, learn_additional_noise=True)
        model = _net(likelihood=lik)
        model.initialize(x, y, generator=torch.Generator().manual_seed(0))
        loss = model.loss(x, y)
        loss.backward()
        assert lik.second_noise_covar.raw_noise.grad.abs().sum() > 0
        plain = _net(task="dirichlet", num_classes=3)
        plain.load_state_dict(
            {k: v for k, v in model.state_dict().items() if "second_noise" not in k}
        )
        with torch.no_grad():
            lik.second_noise_covar.noise = 1e-4  # the constraint's lower bound
            assert float(model.loss(x, y)) == pytest.approx(float(plain.loss(x, y)), rel=1e-3)
