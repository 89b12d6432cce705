"""finetune"""
