"""symkit models: estimators with a scikit-learn-style ``fit``/``score`` contract."""
