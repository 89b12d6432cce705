"""removal"""
