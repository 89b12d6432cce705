"""federated"""
